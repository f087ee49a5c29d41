// The dependency shapes: which data items each op reads and writes, and the
// order ops are pushed in. Every peer walks the same for_each_op(), so all
// peers see the same ops in the same order.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace weft_bench {

// One op: writes item `write`, reads items reads[0..nreads). `tag` makes each
// op's value distinct (the op's number within the shape).
struct Op {
  std::uint32_t write = 0;
  std::uint32_t reads[2] = {0, 0};
  std::uint32_t nreads = 0;
  std::uint32_t tag = 0;
};

enum class ShapeKind { independent, chain, wavefront, tree };

inline constexpr ShapeKind kAllShapes[] = {ShapeKind::independent, ShapeKind::chain, ShapeKind::wavefront,
                                           ShapeKind::tree};

inline std::string_view shape_name(ShapeKind k) noexcept {
  switch (k) {
    case ShapeKind::independent: return "independent";
    case ShapeKind::chain: return "chain";
    case ShapeKind::wavefront: return "wavefront";
    case ShapeKind::tree: return "tree";
  }
  return "?";
}

inline std::optional<ShapeKind> parse_shape(std::string_view s) noexcept {
  for (ShapeKind k : kAllShapes)
    if (shape_name(k) == s) return k;
  return std::nullopt;
}

// A shape at one size. `param` is the shape's own size knob: the wavefront's
// side, the tree's leaf count, the op count otherwise.
struct ShapeSpec {
  ShapeKind kind = ShapeKind::independent;
  std::size_t param = 0;
  std::size_t ops = 0;
  std::size_t items = 0;
  std::string_view name() const noexcept { return shape_name(kind); }
};

inline constexpr std::size_t kNominalOps = 1'000'000;     // independent, chain
inline constexpr std::size_t kNominalSide = 1000;         // wavefront: 1000 x 1000
inline constexpr std::size_t kNominalLeaves = 1u << 20;   // tree: 2^21 - 1 ops

// The shape scaled to about 1/divisor of its nominal op count (divisor: 1, 8,
// 16, 128...). The tree keeps a power-of-two leaf count and the wavefront
// stays square, so the dependency structure is the same at every size.
inline ShapeSpec make_shape(ShapeKind kind, std::size_t divisor) {
  ShapeSpec s;
  s.kind = kind;
  switch (kind) {
    case ShapeKind::independent:
      s.param = s.ops = s.items = kNominalOps / divisor;
      break;
    case ShapeKind::chain:
      s.param = s.ops = kNominalOps / divisor;
      s.items = 1;
      break;
    case ShapeKind::wavefront: {
      const double side = std::round(static_cast<double>(kNominalSide) / std::sqrt(static_cast<double>(divisor)));
      s.param = side < 2 ? 2 : static_cast<std::size_t>(side);
      s.ops = s.items = s.param * s.param;
      break;
    }
    case ShapeKind::tree:
      s.param = std::bit_floor(kNominalLeaves / divisor < 2 ? std::size_t{2} : kNominalLeaves / divisor);
      s.ops = s.items = 2 * s.param - 1;
      break;
  }
  return s;
}

// Calls f(const Op&) for every op of the shape in push order.
//
// wavefront: anti-diagonal order (d = i + j ascending, then i). Row-major order
// would also be a valid topological order, but an engine with a bounded
// in-flight window (Weft: 256 ops by default) would then hold only a sliver of
// one row's chain at a time; along anti-diagonals the window holds independent
// ops. Every peer gets this same order.
//
// tree: heap layout (node k has children 2k+1, 2k+2; leaves are the last
// `param` items), pushed level by level from the leaves up.
template <class F>
void for_each_op(const ShapeSpec& s, F&& f) {
  Op op;
  switch (s.kind) {
    case ShapeKind::independent:
      for (std::size_t i = 0; i < s.ops; ++i) {
        op.write = op.tag = static_cast<std::uint32_t>(i);
        op.nreads = 0;
        f(op);
      }
      break;
    case ShapeKind::chain:
      op.write = 0;
      op.reads[0] = 0;
      op.nreads = 1;
      for (std::size_t i = 0; i < s.ops; ++i) {
        op.tag = static_cast<std::uint32_t>(i);
        f(op);
      }
      break;
    case ShapeKind::wavefront: {
      const std::size_t n = s.param;
      for (std::size_t d = 0; d + 1 < 2 * n; ++d) {
        const std::size_t i_lo = d < n ? 0 : d - n + 1;
        const std::size_t i_hi = d < n ? d : n - 1;
        for (std::size_t i = i_lo; i <= i_hi; ++i) {
          const std::size_t j = d - i;
          const auto self = static_cast<std::uint32_t>(i * n + j);
          op.write = op.tag = self;
          op.nreads = 0;
          if (i > 0) op.reads[op.nreads++] = self - static_cast<std::uint32_t>(n);  // (i-1, j)
          if (j > 0) op.reads[op.nreads++] = self - 1;                              // (i, j-1)
          f(op);
        }
      }
      break;
    }
    case ShapeKind::tree: {
      // Level l (leaves: l = 0) holds nodes [first, first + count).
      std::size_t count = s.param;
      std::size_t first = s.param - 1;
      op.nreads = 0;
      for (std::size_t k = first; k < first + count; ++k) {
        op.write = op.tag = static_cast<std::uint32_t>(k);
        f(op);
      }
      op.nreads = 2;
      while (count > 1) {
        count /= 2;
        first = count - 1;
        for (std::size_t k = first; k < first + count; ++k) {
          op.write = op.tag = static_cast<std::uint32_t>(k);
          op.reads[0] = static_cast<std::uint32_t>(2 * k + 1);
          op.reads[1] = static_cast<std::uint32_t>(2 * k + 2);
          f(op);
        }
      }
      break;
    }
  }
}

}  // namespace weft_bench
