// 2-D convolution as im2col + gemm (col2im for the data gradient). The batch
// is the parallel axis: each piece of images gets its own column buffer.
//
// Images go through the gemms in groups: a group's column matrices sit side
// by side ([C*KH*KW, group * OH*OW]), so one product covers them all. Small
// outputs need it: ResNet-18's last stage has 4x4 outputs, where one image's
// product is 16 columns wide and its filter gradient rewrites the whole
// 512x4608 filter for each image (memory-bound: it took 53% of a training
// step, 3.4x the forward convolution's time). The group size depends only
// on the shape, so results do not depend on the thread count.
#include <algorithm>
#include <cstring>
#include <memory>
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
  std::int64_t group;                 // images per product
  std::int64_t cols() const noexcept { return group * ohw; }  // columns of a group's matrices
};

// A group's products are at least this many columns wide (when the batch
// has enough images); an image whose output plane is that large goes alone.
constexpr std::int64_t kGroupColumns = 256;

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
  d.group = d.ohw > 0 ? std::clamp<std::int64_t>((kGroupColumns + d.ohw - 1) / d.ohw, 1, std::max<std::int64_t>(g.n, 1)) : 1;
  d.direct = g.kh == 1 && g.kw == 1 && g.stride == 1 && g.pad == 0 && d.group == 1;
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

// col[(c, ki, kj), (oh, ow)] = x[c, oh*s - pad + ki, ow*s - pad + kj], 0 outside;
// row r of col starts at col + r * ld.
void im2col(float* col, std::int64_t ld, const float* x, const ConvGeometry& g, const Dims& d) {
  const std::int64_t s = g.stride;
  for (std::int64_t c = 0; c < g.c; ++c) {
    const float* plane = x + c * d.hw;
    for (std::int64_t ki = 0; ki < g.kh; ++ki) {
      std::int64_t oh_lo, oh_hi;
      valid_outputs(ki - g.pad, g.h, s, d.oh, oh_lo, oh_hi);
      for (std::int64_t kj = 0; kj < g.kw; ++kj) {
        std::int64_t ow_lo, ow_hi;
        valid_outputs(kj - g.pad, g.w, s, d.ow, ow_lo, ow_hi);
        float* row = col + ((c * g.kh + ki) * g.kw + kj) * ld;
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
void col2im(float* dx, const float* col, std::int64_t ld, const ConvGeometry& g, const Dims& d) {
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
        const float* row = col + ((c * g.kh + ki) * g.kw + kj) * ld;
        for (std::int64_t oh = oh_lo; oh < oh_hi; ++oh) {
          const float* in = row + oh * d.ow;
          float* out = plane + (oh * s - g.pad + ki) * g.w;
          for (std::int64_t ow = ow_lo; ow < ow_hi; ++ow) out[ow * s + kj - g.pad] += in[ow];
        }
      }
    }
  }
}

// Work of one group, in multiply-adds, to size the pieces of the batch.
std::int64_t group_cost(const ConvGeometry& g, const Dims& d) {
  return std::max<std::int64_t>(1, g.o * d.ckk * d.cols());
}

std::int64_t groups_of(const ConvGeometry& g, const Dims& d) { return (g.n + d.group - 1) / d.group; }

// The group's column matrices side by side: col[ckk, images * ohw].
void group_im2col(float* col, const float* x, std::int64_t first, std::int64_t images, const ConvGeometry& g,
                  const Dims& d) {
  for (std::int64_t j = 0; j < images; ++j) im2col(col + j * d.ohw, images * d.ohw, x + (first + j) * g.c * d.hw, g, d);
}

// Per image [o, ohw] planes (t's layout) <-> one [o, images * ohw] matrix.
void gather_planes(float* m, const float* t, std::int64_t first, std::int64_t images, std::int64_t o,
                   std::int64_t ohw) {
  for (std::int64_t j = 0; j < images; ++j)
    for (std::int64_t r = 0; r < o; ++r)
      std::copy_n(t + ((first + j) * o + r) * ohw, ohw, m + r * images * ohw + j * ohw);
}

}  // namespace

void conv2d_forward(float* y, const float* x, const float* w, const float* b, const ConvGeometry& g) {
  if (g.nhwc) return conv2d_forward_nhwc(y, x, w, b, g);
  const Dims d = dims(g);
  if (g.n == 0 || g.o == 0 || d.ohw == 0) return;
  detail::parallel_for(groups_of(g, d), detail::grain_for(group_cost(g, d)), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.ckk * d.cols()));
    std::vector<float> out(d.group > 1 ? static_cast<std::size_t>(g.o * d.cols()) : 0);
    for (std::int64_t grp = lo; grp < hi; ++grp) {
      const std::int64_t first = grp * d.group, images = std::min(d.group, g.n - first), cols = images * d.ohw;
      if (d.group == 1) {
        const float* xi = x + first * g.c * d.hw;
        float* yi = y + first * g.o * d.ohw;
        if (!d.direct) im2col(col.data(), d.ohw, xi, g, d);
        if (b)
          for (std::int64_t o = 0; o < g.o; ++o) std::fill(yi + o * d.ohw, yi + (o + 1) * d.ohw, b[o]);
        gemm(false, false, g.o, d.ohw, d.ckk, 1.0f, w, d.ckk, d.direct ? xi : col.data(), d.ohw, b ? 1.0f : 0.0f, yi,
             d.ohw);
        continue;
      }
      // out[o, images * ohw] = w * col, then scattered into each image's planes (plus the bias).
      group_im2col(col.data(), x, first, images, g, d);
      gemm(false, false, g.o, cols, d.ckk, 1.0f, w, d.ckk, col.data(), cols, 0.0f, out.data(), cols);
      for (std::int64_t j = 0; j < images; ++j)
        for (std::int64_t o = 0; o < g.o; ++o) {
          const float* src = out.data() + o * cols + j * d.ohw;
          float* dst = y + ((first + j) * g.o + o) * d.ohw;
          if (b)
            for (std::int64_t p = 0; p < d.ohw; ++p) dst[p] = src[p] + b[o];
          else
            std::copy_n(src, d.ohw, dst);
        }
    }
  });
}

void conv2d_backward_data(float* dx, const float* dy, const float* w, const ConvGeometry& g) {
  if (g.nhwc) return conv2d_backward_data_nhwc(dx, dy, w, g);
  const Dims d = dims(g);
  if (g.n == 0 || g.c == 0 || d.hw == 0) return;
  detail::parallel_for(groups_of(g, d), detail::grain_for(group_cost(g, d)), [&](std::int64_t lo, std::int64_t hi) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.ckk * d.cols()));
    std::vector<float> dyg(d.group > 1 ? static_cast<std::size_t>(g.o * d.cols()) : 0);
    for (std::int64_t grp = lo; grp < hi; ++grp) {
      const std::int64_t first = grp * d.group, images = std::min(d.group, g.n - first), cols = images * d.ohw;
      float* dx0 = dx + first * g.c * d.hw;
      // dcol[ckk, cols] = w^T * dy of the group; the direct case writes it straight into dx.
      const float* dys = dy + first * g.o * d.ohw;
      if (d.group > 1) {
        gather_planes(dyg.data(), dy, first, images, g.o, d.ohw);
        dys = dyg.data();
      }
      gemm(true, false, d.ckk, cols, g.o, 1.0f, w, d.ckk, dys, cols, 0.0f, d.direct ? dx0 : col.data(), cols);
      if (!d.direct)
        for (std::int64_t j = 0; j < images; ++j) col2im(dx0 + j * g.c * d.hw, col.data() + j * d.ohw, cols, g, d);
    }
  });
}

void conv2d_backward_filter(float* dw, float* db, const float* x, const float* dy, const ConvGeometry& g) {
  if (g.nhwc) return conv2d_backward_filter_nhwc(dw, db, x, dy, g);
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

  // dw is a sum over the batch. The batch's groups are cut into a fixed
  // number of parts that depends only on the shape; each part sums its
  // groups into its own buffer (part 0 straight into dw) and the parts are
  // added in order at the end, so the result is the same on any number of
  // threads. A part buffer costs a pass over the filter, so each part gets
  // at least kPartColumns columns of product (each gemm splits over the
  // threads anyway), and the extra buffers stay within kPartFloats.
  constexpr std::int64_t kMaxParts = 16;
  constexpr std::int64_t kPartColumns = 1024;
  constexpr std::int64_t kPartFloats = std::int64_t{1} << 22;  // over all extra parts
  const std::int64_t groups = groups_of(g, d);
  const std::int64_t parts = std::max<std::int64_t>(
      1, std::min({groups, kMaxParts, g.n * d.ohw / kPartColumns, 1 + kPartFloats / wsize}));
  // Uninitialized: each part's first product overwrites its buffer.
  std::unique_ptr<float[]> extra(parts > 1 ? new float[static_cast<std::size_t>((parts - 1) * wsize)] : nullptr);
  auto part_buffer = [&](std::int64_t p) { return p == 0 ? dw : extra.get() + (p - 1) * wsize; };

  detail::parallel_for(parts, 1, [&](std::int64_t pb, std::int64_t pe) {
    std::vector<float> col(d.direct ? 0 : static_cast<std::size_t>(d.ckk * d.cols()));
    std::vector<float> dyg(d.group > 1 ? static_cast<std::size_t>(g.o * d.cols()) : 0);
    for (std::int64_t p = pb; p < pe; ++p) {
      float* acc = part_buffer(p);
      const std::int64_t first_group = groups * p / parts, last_group = groups * (p + 1) / parts;
      if (first_group == last_group) std::fill(acc, acc + wsize, 0.0f);
      for (std::int64_t grp = first_group; grp < last_group; ++grp) {
        const std::int64_t first = grp * d.group, images = std::min(d.group, g.n - first), cols = images * d.ohw;
        const float* xs = x + first * g.c * d.hw;
        const float* dys = dy + first * g.o * d.ohw;
        if (!d.direct) group_im2col(col.data(), x, first, images, g, d);
        if (d.group > 1) {
          gather_planes(dyg.data(), dy, first, images, g.o, d.ohw);
          dys = dyg.data();
        }
        // acc[o, ckk] (+)= dy_group[o, cols] * col[ckk, cols]^T
        gemm(false, true, g.o, d.ckk, cols, 1.0f, dys, cols, d.direct ? xs : col.data(), cols,
             grp == first_group ? 0.0f : 1.0f, acc, d.ckk);
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
