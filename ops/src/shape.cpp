#include "weft/shape.h"

#include "weft/error.h"

namespace weft {

Shape::Shape(std::initializer_list<std::int64_t> dims) : Shape(std::vector<std::int64_t>(dims)) {}

Shape::Shape(std::vector<std::int64_t> dims) : dims_(std::move(dims)) {
  std::int64_t total = 1;
  for (std::int64_t d : dims_) {
    if (d < 0) throw Error("shape " + str() + " has a negative extent");
    if (d != 0 && total > (std::int64_t{1} << 48) / d) throw Error("shape " + str() + " has too many elements");
    total *= d;
  }
}

std::int64_t Shape::numel() const noexcept {
  std::int64_t n = 1;
  for (std::int64_t d : dims_) n *= d;
  return n;
}

std::string Shape::str() const {
  std::string s = "[";
  for (std::size_t i = 0; i < dims_.size(); ++i) s += (i ? ", " : "") + std::to_string(dims_[i]);
  return s + "]";
}

}  // namespace weft
