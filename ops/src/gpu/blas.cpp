// Row-major GEMM and dense layers over cuBLAS. A row-major matrix is the
// transpose of the same bytes read column-major, so C = op(A) op(B) becomes
// C^T = op(B)^T op(A)^T in cuBLAS's terms: swap the operands and m with n,
// keep each operand's transpose flag. The 64-bit (_64) entry points take the
// int64 sizes as they are.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "weft/checked_call.h"

namespace weft::kernels::gpu {

void gemm(const WorkerHandles& h, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n, std::int64_t k,
          float alpha, const float* a, std::int64_t lda, const float* b, std::int64_t ldb, float beta, float* c,
          std::int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  // cuBLAS would reject the leading dimensions of empty A/B; the product is
  // zero, so only the beta scaling of C remains.
  if (k <= 0 || alpha == 0.0f) return detail::scale_matrix(h, c, m, n, ldc, beta);
  WEFT_CUBLAS_CHECK(cublasSetStream(h.cublas, detail::cuda_stream(h)));
  WEFT_CUBLAS_CHECK(cublasSgemm_64(h.cublas, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
                                   n, m, k, &alpha, b, ldb, a, lda, &beta, c, ldc));
}

void dense_forward(const WorkerHandles& h, float* y, const float* x, const float* w, const float* b,
                   std::int64_t batch, std::int64_t in, std::int64_t out) {
  // y = x w^T: x is batch x in, w is out x in.
  gemm(h, false, true, batch, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (b != nullptr) detail::add_row_bias(h, y, b, batch, out);
}

void dense_backward(const WorkerHandles& h, float* dx, float* dw, float* db, const float* x, const float* w,
                    const float* dy, std::int64_t batch, std::int64_t in, std::int64_t out) {
  // dx[batch, in] = dy[batch, out] w[out, in]
  if (dx != nullptr) gemm(h, false, false, batch, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in);
  // dw[out, in] = dy^T x
  if (dw != nullptr) gemm(h, true, false, out, in, batch, 1.0f, dy, out, x, in, 0.0f, dw, in);
  if (db != nullptr) detail::column_sums(h, db, dy, batch, out);
}

}  // namespace weft::kernels::gpu
