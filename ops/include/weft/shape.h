// Tensor shapes: a list of non-negative extents, row-major.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

namespace weft {

class Shape {
 public:
  Shape() = default;  // a scalar (rank 0, one element)
  Shape(std::initializer_list<std::int64_t> dims);
  explicit Shape(std::vector<std::int64_t> dims);  // throws weft::Error for a negative extent

  std::size_t rank() const noexcept { return dims_.size(); }
  std::int64_t operator[](std::size_t axis) const { return dims_.at(axis); }
  std::int64_t numel() const noexcept;
  const std::vector<std::int64_t>& dims() const noexcept { return dims_; }
  std::string str() const;  // "[256, 1, 28, 28]"
  bool operator==(const Shape&) const = default;

 private:
  std::vector<std::int64_t> dims_;
};

}  // namespace weft
