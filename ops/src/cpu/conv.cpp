// 2-D convolution as im2col + gemm (col2im for the data gradient). The batch
// is the parallel axis: each piece of images gets its own column buffer.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "weft/error.h"

namespace weft::kernels::cpu {
namespace {

struct Dims {
  std::int64_t oh, ow, ohw, ckk, hw;  // output plane, rows of the column matrix, input plane
  bool direct;                        // 1x1, stride 1, no padding: the image is its own column matrix
};

// ConvGeometry::out_h() divides a negative numerator toward zero when the
// padded input is smaller than the filter; that is an empty output here.
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
  d.ckk = g.c * g.kh * g.kw;
  d.hw = g.h * g.w;
  d.direct = g.kh == 1 && g.kw == 1 && g.stride == 1 && g.pad == 0;
  return d;
}

// Output positions [lo, hi) of one axis whose input position o * stride + off
// falls inside [0, size): the rest read the zero padding.
void valid_outputs(std::int64_t off, std::int64_t size, std::int64_t stride, std::int64_t out, std::int64_t& lo,
                   std::int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + stride - 1) / stride;
  hi = size - 1 - off < 0 ? 0 : (size - 1 - off) / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// col[(c, ki, kj), (oh, ow)] = x[c, oh*s - pad + ki, ow*s - pad + kj], 0 outside.
void im2col(float* col, const float* x, const ConvGeometry& g, const Dims& d) {
  const std::int64_t s = g.stride;
  for (std::int64_t c = 0; c < g.c; ++c) {
    const float* plane = x + c * d.hw;
    for (std::int64_t ki = 0; ki < g.kh; ++ki) {
      std::int64_t oh_lo, oh_hi;
      valid_outputs(ki - g.pad, g.h, s, d.oh, oh_lo, oh_hi);
      for (std::int64_t kj = 0; kj < g.kw; ++kj) {
        std::int64_t ow_lo, ow_hi;
        valid_outputs(kj - g.pad, g.w, s, d.ow, ow_lo, ow_hi);
        float* row = col + ((c * g.kh + ki) * g.kw + kj) * d.ohw;
        std::fill(row, row + oh_lo * d.ow, 0.0f);
        for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          float* out = row + oh * d.ow;
          const float* in = plane + (oh * s - g.pad + ki) * g.w;
          std::fill(out, out + ow_lo, 0.0f);
          for (std::int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow] = in[ow * s + kj - g.pad];
          std::fill(out + ow_hi, out + d.ow, 0.0f);
        }
        std::fill(row + oh_hi * d.ow, row + d.ohw, 0.0f);
      }
    }
  }
}

// The adjoint of im2col: dx = 0, then every column entry adds into the input
// position it was read from (overlapping windows accumulate).
void col2im(float* dx, const float* col, const ConvGeometry& g, const Dims& d) {
  const std::int64_t s = g.stride;
  std::fill(dx, dx + g.c * d.hw, 0.0f);
  for (std::int64_t c = 0; c < g.c; ++c) {
    float* plane = dx + c * d.hw;
    for (std::int64_t ki = 0; ki < g.kh; ++ki) {
      std::int64_t oh_lo, oh_hi;
      valid_outputs(ki - g.pad, g.h, s, d.oh, oh_lo, oh_hi);
      for (std::int64_t kj = 0; kj < g.kw; ++kj) {
        std::int64_t ow_lo, ow_hi;
        valid_outputs(kj - g.pad, g.w, s, d.ow, ow_lo, ow_hi);
        const float* row = col + ((c * g.kh + ki) * g.kw + kj) * d.ohw;
        for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const float* in = row + oh * d.ow;
          float* out = plane + (oh * s - g.pad + ki) * g.w;
          for (std::int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * s + kj - g.pad] += in[ow];
        }
      }
    }
  }
}

// Work of one image, in multiply-adds, to size the pieces of the batch.
std::int64_t image_cost(const ConvGeometry& g, const Dims& d) { return std::max<std::int64_t>(1, g.o * d.ckk * d.ohw); }

}  // namespace

void conv2d_forward(float* y, const float* x, const float* w, const float* b, const ConvGeometry& g) {
  const Dims d = dims(g);
  if (g.n == 0 || g.o == 0 || d.ohw == 0) return;
  detail::parallel_for(g.n, detail::grain_for(image_cost(g, d)), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.ckk * d.ohw));
    for (std::int64_t i = lo; i < hi; ++i) {
      const float* xi = x + i * g.c * d.hw;
      float* yi = y + i * g.o * d.ohw;
      if (!d.direct) im2col(col.data(), xi, g, d);
      if (b)
        for (std::int64_t o = 0; o < g.o; ++o) std::fill(yi + o * d.ohw, yi + (o + 1) * d.ohw, b[o]);
      gemm(false, false, g.o, d.ohw, d.ckk, 1.0f, w, d.ckk, d.direct ? xi : col.data(), d.ohw, b ? 1.0f : 0.0f, yi,
           d.ohw);
    }
  });
}

void conv2d_backward_data(float* dx, const float* dy, const float* w, const ConvGeometry& g) {
  const Dims d = dims(g);
  if (g.n == 0 || g.c == 0 || d.hw == 0) return;
  detail::parallel_for(g.n, detail::grain_for(image_cost(g, d)), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.ckk * d.ohw));
    for (std::int64_t i = lo; i < hi; ++i) {
      float* dxi = dx + i * g.c * d.hw;
      const float* dyi = dy + i * g.o * d.ohw;
      // dcol[ckk, ohw] = w^T * dy_i; the direct case writes it straight into dx.
      gemm(true, false, d.ckk, d.ohw, g.o, 1.0f, w, d.ckk, dyi, d.ohw, 0.0f, d.direct ? dxi : col.data(), d.ohw);
      if (!d.direct) col2im(dxi, col.data(), g, d);
    }
  });
}

void conv2d_backward_filter(float* dw, float* db, const float* x, const float* dy, const ConvGeometry& g) {
  const Dims d = dims(g);
  const std::int64_t wsize = g.o * d.ckk;
  if (db) {
    // Per output channel, in double, images and positions always in the same order.
    detail::parallel_for(g.o, detail::grain_for(g.n * d.ohw), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t o = lo; o < hi; ++o) {
        double s = 0.0;
        for (std::int64_t i = 0; i < g.n; ++i) {
          const float* p = dy + (i * g.o + o) * d.ohw;
          for (std::int64_t j = 0; j < d.ohw; ++j) s += p[j];
        }
        db[o] = static_cast<float>(s);
      }
    });
  }
  if (wsize == 0) return;

  // dw is a sum over the batch. The batch is cut into a fixed number of parts
  // that depends only on the shape; each part sums its images into its own
  // buffer (part 0 straight into dw) and the parts are added in order at the
  // end, so the result is the same on any number of threads. The cap on the
  // part count keeps the extra buffers within a few tens of megabytes.
  constexpr std::int64_t kMaxParts = 16;
  constexpr std::int64_t kPartFloats = std::int64_t{1} << 24;  // over all extra parts
  const std::int64_t parts =
      std::max<std::int64_t>(1, std::min({g.n, kMaxParts, 1 + kPartFloats / wsize}));
  std::vector<float> extra(static_cast<std::size_t>((parts - 1) * wsize));
  auto part_buffer = [&](std::int64_t p) { return p == 0 ? dw : extra.data() + (p - 1) * wsize; };

  detail::parallel_for(parts, 1, [&](std::int64_t pb, std::int64_t pe) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.ckk * d.ohw));
    for (std::int64_t p = pb; p < pe; ++p) {
      float* acc = part_buffer(p);
      const std::int64_t first = g.n * p / parts, last = g.n * (p + 1) / parts;
      if (first == last) std::fill(acc, acc + wsize, 0.0f);
      for (std::int64_t i = first; i < last; ++i) {
        const float* xi = x + i * g.c * d.hw;
        if (!d.direct) im2col(col.data(), xi, g, d);
        // acc[o, ckk] (+)= dy_i[o, ohw] * col[ckk, ohw]^T
        gemm(false, true, g.o, d.ckk, d.ohw, 1.0f, dy + i * g.o * d.ohw, d.ohw, d.direct ? xi : col.data(), d.ohw,
             i == first ? 0.0f : 1.0f, acc, d.ckk);
      }
    }
  });
  if (parts > 1) {
    detail::parallel_for(wsize, detail::grain_for(parts), [&](std::int64_t lo, std::int64_t hi) {
      for (std::int64_t p = 1; p < parts; ++p) {
        const float* src = part_buffer(p);
        for (std::int64_t j = lo; j < hi; ++j) dw[j] += src[j];
      }
    });
  }
}

}  // namespace weft::kernels::cpu
