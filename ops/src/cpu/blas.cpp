// gemm on OpenBLAS. OpenBLAS is pinned to one thread (see intra_op.h), so a
// big product is split here into independent pieces of C, one cblas_sgemm
// each, run across the shared arena.
#include <cblas.h>

#include <algorithm>
#include <climits>
#include <string>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"
#include "weft/error.h"

namespace weft::kernels::cpu {
namespace {

// Below this many multiply-adds one call is faster than any split.
constexpr double kSplitWork = double(1 << 21);
// Pieces: at most kMaxPieces per product (each piece repacks the other
// operand, so fewer, larger pieces waste less), at least kMinPiece wide.
// With 64-row pieces at any size a 2048^2 product ran at 0.87x of OpenBLAS's
// own threading (weft-bench-ops); with at most 4 pieces it runs at ~1.0x,
// and a 256^2 product still splits in 4.
constexpr std::int64_t kMaxPieces = 4;
constexpr std::int64_t kMinPiece = 64;
// Pieces are whole multiples of this, a multiple of OpenBLAS's register tiles.
constexpr std::int64_t kPieceAlign = 16;

int to_blas_int(std::int64_t v, const char* what) {
  if (v > INT_MAX) throw Error(std::string("gemm: ") + what + " = " + std::to_string(v) + " exceeds the BLAS int range");
  return static_cast<int>(v);
}

void sgemm(bool ta, bool tb, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
           std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, to_blas_int(m, "m"),
              to_blas_int(n, "n"), to_blas_int(k, "k"), alpha, a, to_blas_int(lda, "lda"), b, to_blas_int(ldb, "ldb"),
              beta, c, to_blas_int(ldc, "ldc"));
}

// C = beta * C where op(A) * op(B) contributes nothing; BLAS semantics: with
// beta == 0, C is not read (it may hold NaN).
void scale_c(std::int64_t m, std::int64_t n, float beta, float* c, std::int64_t ldc) {
  detail::parallel_for(m, detail::grain_for(n), [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t i = b; i < e; ++i) {
      float* row = c + i * ldc;
      if (beta == 0.0f) {
        std::fill(row, row + n, 0.0f);
      } else if (beta != 1.0f) {
        for (std::int64_t j = 0; j < n; ++j) row[j] *= beta;
      }
    }
  });
}

}  // namespace

void gemm(bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const float* a,
          std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c, std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {
    scale_c(m, n, beta, c, ldc);
    return;
  }
  intra_op_arena();  // makes sure OpenBLAS is pinned to one thread before its first call

  const double work = double(m) * double(n) * double(k);
  if (work <= kSplitWork) {
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // The pieces depend only on the shape, never on the thread count, so every
  // element of C comes from the same OpenBLAS call shape (and rounding) on 1
  // thread or many. Split the longer side of C: rows when it is tall, columns
  // when it is wide (dense weight gradients: few rows, many columns).
  const bool by_rows = m >= n;
  const std::int64_t side = by_rows ? m : n;
  const double other = double(by_rows ? n : m) * double(k);
  std::int64_t piece = static_cast<std::int64_t>(kSplitWork / other) + 1;
  piece = std::max({piece, kMinPiece, (side + kMaxPieces - 1) / kMaxPieces});
  piece = (piece + kPieceAlign - 1) / kPieceAlign * kPieceAlign;
  const std::int64_t pieces = (side + piece - 1) / piece;

  detail::parallel_for(pieces, 1, [&](std::int64_t pb, std::int64_t pe) {
    for (std::int64_t p = pb; p < pe; ++p) {
      const std::int64_t lo = p * piece, len = std::min(side, lo + piece) - lo;
      if (by_rows) {
        // Row lo of op(A): row lo of A as stored, or column lo of A when transposed.
        const float* a_lo = trans_a ? a + lo : a + lo * lda;
        sgemm(trans_a, trans_b, len, n, k, alpha, a_lo, lda, b, ldb, beta, c + lo * ldc, ldc);
      } else {
        // Column lo of op(B): column lo of B as stored, or row lo of B when transposed.
        const float* b_lo = trans_b ? b + lo * ldb : b + lo;
        sgemm(trans_a, trans_b, m, len, k, alpha, a, lda, b_lo, ldb, beta, c + lo, ldc);
      }
    }
  });
}

}  // namespace weft::kernels::cpu

namespace weft::kernels::cpu {

void gemm_batched(bool trans_a, bool trans_b, std::int64_t batch, std::int64_t m, std::int64_t n, std::int64_t k,
                  float alpha, const float* a, std::int64_t lda, std::int64_t stride_a, const float* b,
                  std::int64_t ldb, std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                  std::int64_t stride_c) {
  // One gemm per matrix; gemm's own split depends only on its shape, so the
  // bits never depend on how the batch is spread over the threads.
  const double work = std::max(1.0, double(m) * double(n) * double(std::max<std::int64_t>(k, 1)));
  detail::parallel_for(batch, static_cast<std::int64_t>(std::max(1.0, kSplitWork / work)),
                       [&](std::int64_t lo, std::int64_t hi) {
                         for (std::int64_t i = lo; i < hi; ++i)
                           gemm(trans_a, trans_b, m, n, k, alpha, a + i * stride_a, lda, b + i * stride_b, ldb, beta,
                                c + i * stride_c, ldc);
                       });
}

}  // namespace weft::kernels::cpu
