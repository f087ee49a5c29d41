// 2-D convolution on channels-last data (ConvGeometry::nhwc): x, y, dx, dy
// stored NHWC, w and dw OHWI. A row of the column matrix is one output
// position's window, (ki, kj, c) in the filter's order, so each pass is one
// GEMM per piece of the batch with the positions as rows:
//   forward          y[pos, o]      = col[pos, kkc] * w[o, kkc]^T (+ b[o])
//   backward data    dcol[pos, kkc] = dy[pos, o] * w[o, kkc], then col2im
//   backward filter  dw[o, kkc]    += dy[pos, o]^T * col[pos, kkc]
// 1x1 filters at stride 1 without padding read x itself as the column matrix.
// The batch is cut into pieces of whole images whose column matrix stays
// within kPieceFloats; the size depends only on the shape, and the filter
// gradient adds the pieces in order, so results do not depend on the thread
// count.
#include <algorithm>
#include <string>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "weft/error.h"

namespace weft::kernels::cpu {
namespace nhwc {

constexpr std::int64_t kPieceFloats = std::int64_t{1} << 22;

struct Dims {
  std::int64_t oh, ow, ohw, hw, kkc;
  bool direct;
  std::int64_t images;  // per piece
  std::int64_t pieces(std::int64_t n) const noexcept { return (n + images - 1) / images; }
};

std::int64_t out_extent(std::int64_t in, std::int64_t pad, std::int64_t k, std::int64_t stride) {
  const std::int64_t span = in + 2 * pad - k;
  return span < 0 ? 0 : span / stride + 1;
}

Dims dims(const ConvGeometry& g) {
  if (g.stride < 1 || g.pad < 0 || g.kh < 1 || g.kw < 1 || g.n < 0 || g.c < 0 || g.h < 0 || g.w < 0 || g.o < 0)
    throw Error("conv2d: invalid geometry (stride " + std::to_string(g.stride) + ", pad " + std::to_string(g.pad) +
                ", kernel " + std::to_string(g.kh) + "x" + std::to_string(g.kw) + ")");
  Dims d{};
  d.oh = out_extent(g.h, g.pad, g.kh, g.stride);
  d.ow = out_extent(g.w, g.pad, g.kw, g.stride);
  d.ohw = d.oh * d.ow;
  d.hw = g.h * g.w;
  d.kkc = g.kh * g.kw * g.c;
  d.direct = g.kh == 1 && g.kw == 1 && g.stride == 1 && g.pad == 0;
  const std::int64_t per_image = std::max<std::int64_t>(1, d.ohw * std::max<std::int64_t>(d.kkc, g.o));
  d.images = std::clamp<std::int64_t>(kPieceFloats / per_image, 1, std::max<std::int64_t>(g.n, 1));
  return d;
}

// col[(j, oh, ow), (ki, kj, c)] = x[j, oh*s - pad + ki, ow*s - pad + kj, c], 0 outside.
void im2col(float* col, const float* x, std::int64_t images, const ConvGeometry& g, const Dims& d) {
  for (std::int64_t j = 0; j < images; ++j)
    for (std::int64_t oh = 0; oh < d.oh; ++oh)
      for (std::int64_t ow = 0; ow < d.ow; ++ow) {
        float* row = col + ((j * d.oh + oh) * d.ow + ow) * d.kkc;
        for (std::int64_t ki = 0; ki < g.kh; ++ki) {
          const std::int64_t ih = oh * g.stride - g.pad + ki;
          for (std::int64_t kj = 0; kj < g.kw; ++kj) {
            const std::int64_t iw = ow * g.stride - g.pad + kj;
            float* dst = row + (ki * g.kw + kj) * g.c;
            if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w)
              std::fill(dst, dst + g.c, 0.0f);
            else
              std::copy_n(x + ((j * g.h + ih) * g.w + iw) * g.c, g.c, dst);
          }
        }
      }
}

// The adjoint: dx = 0, then each column entry adds into the input position it was read from.
void col2im(float* dx, const float* col, std::int64_t images, const ConvGeometry& g, const Dims& d) {
  std::fill(dx, dx + images * d.hw * g.c, 0.0f);
  for (std::int64_t j = 0; j < images; ++j)
    for (std::int64_t oh = 0; oh < d.oh; ++oh)
      for (std::int64_t ow = 0; ow < d.ow; ++ow) {
        const float* row = col + ((j * d.oh + oh) * d.ow + ow) * d.kkc;
        for (std::int64_t ki = 0; ki < g.kh; ++ki) {
          const std::int64_t ih = oh * g.stride - g.pad + ki;
          if (ih < 0 || ih >= g.h) continue;
          for (std::int64_t kj = 0; kj < g.kw; ++kj) {
            const std::int64_t iw = ow * g.stride - g.pad + kj;
            if (iw < 0 || iw >= g.w) continue;
            const float* src = row + (ki * g.kw + kj) * g.c;
            float* dst = dx + ((j * g.h + ih) * g.w + iw) * g.c;
            for (std::int64_t c = 0; c < g.c; ++c) dst[c] += src[c];
          }
        }
      }
}

}  // namespace nhwc


void conv2d_forward_nhwc(float* y, const float* x, const float* w, const float* b, const ConvGeometry& g) {
  const nhwc::Dims d = nhwc::dims(g);
  if (g.n == 0 || g.o == 0 || d.ohw == 0) return;
  if (d.kkc == 0) {  // no input channels: the sum over them is 0, leaving the bias
    for (std::int64_t r = 0; r < g.n * d.ohw; ++r)
      for (std::int64_t o = 0; o < g.o; ++o) y[r * g.o + o] = b ? b[o] : 0.0f;
    return;
  }
  detail::parallel_for(d.pieces(g.n), 1, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.images * d.ohw * d.kkc));
    for (std::int64_t piece = lo; piece < hi; ++piece) {
      const std::int64_t first = piece * d.images, images = std::min(d.images, g.n - first), rows = images * d.ohw;
      const float* xs = x + first * d.hw * g.c;
      float* ys = y + first * d.ohw * g.o;
      if (!d.direct) nhwc::im2col(col.data(), xs, images, g, d);
      if (b)
        for (std::int64_t r = 0; r < rows; ++r) std::copy_n(b, g.o, ys + r * g.o);
      gemm(false, true, rows, g.o, d.kkc, 1.0f, d.direct ? xs : col.data(), d.kkc, w, d.kkc, b ? 1.0f : 0.0f, ys,
           g.o);
    }
  });
}

void conv2d_backward_data_nhwc(float* dx, const float* dy, const float* w, const ConvGeometry& g) {
  const nhwc::Dims d = nhwc::dims(g);
  if (g.n == 0 || g.c == 0 || d.hw == 0) return;
  if (d.ohw == 0 || g.o == 0) {  // no output (or no filter): nothing flows back
    std::fill(dx, dx + g.n * d.hw * g.c, 0.0f);
    return;
  }
  detail::parallel_for(d.pieces(g.n), 1, [&](std::int64_t lo, std::int64_t hi) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.images * d.ohw * d.kkc));
    for (std::int64_t piece = lo; piece < hi; ++piece) {
      const std::int64_t first = piece * d.images, images = std::min(d.images, g.n - first), rows = images * d.ohw;
      float* dxs = dx + first * d.hw * g.c;
      gemm(false, false, rows, d.kkc, g.o, 1.0f, dy + first * d.ohw * g.o, g.o, w, d.kkc, 0.0f,
           d.direct ? dxs : col.data(), d.kkc);
      if (!d.direct) nhwc::col2im(dxs, col.data(), images, g, d);
    }
  });
}

void conv2d_backward_filter_nhwc(float* dw, float* db, const float* x, const float* dy, const ConvGeometry& g) {
  const nhwc::Dims d = nhwc::dims(g);
  const std::int64_t rows_all = g.n * d.ohw;
  if (db) {
    // Per output channel, in double, positions always in the same order.
    detail::parallel_for(g.o, detail::grain_for(rows_all), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t o = lo; o < hi; ++o) {
        double s = 0.0;
        for (std::int64_t r = 0; r < rows_all; ++r) s += dy[r * g.o + o];
        db[o] = static_cast<float>(s);
      }
    });
  }
  const std::int64_t wsize = g.o * d.kkc;
  if (wsize == 0) return;
  if (rows_all == 0) {
    std::fill(dw, dw + wsize, 0.0f);
    return;
  }
  std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.images * d.ohw * d.kkc));
  for (std::int64_t piece = 0; piece < d.pieces(g.n); ++piece) {
    const std::int64_t first = piece * d.images, images = std::min(d.images, g.n - first), rows = images * d.ohw;
    const float* xs = x + first * d.hw * g.c;
    if (!d.direct) nhwc::im2col(col.data(), xs, images, g, d);
    gemm(true, false, g.o, d.kkc, rows, 1.0f, dy + first * d.ohw * g.o, g.o, d.direct ? xs : col.data(), d.kkc,
         piece == 0 ? 0.0f : 1.0f, dw, d.kkc);
  }
}

}  // namespace weft::kernels::cpu
