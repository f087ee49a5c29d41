// Row-major GEMM and dense layers over cuBLAS. A row-major matrix is the
// transpose of the same bytes read column-major, so C = op(A) op(B) becomes
// C^T = op(B)^T op(A)^T in cuBLAS's terms: swap the operands and m with n,
// keep each operand's transpose flag. The 64-bit (_64) entry points take the
// int64 sizes as they are.
//
// Strict float32 is cublasSgemm (FMA, no tensor cores); float32 with tf32 is
// cublasGemmEx with CUBLAS_COMPUTE_32F_FAST_TF32; bfloat16 and float16 are
// cublasGemmEx with half inputs and output, float32 accumulation and float
// alpha/beta (CUBLAS_COMPUTE_32F), on tensor cores.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "weft/checked_call.h"

namespace weft::kernels::gpu {
namespace {

cudaDataType_t cuda_type(DType t, const char* op) {
  switch (t) {
    case DType::float32: return CUDA_R_32F;
    case DType::bfloat16: return CUDA_R_16BF;
    case DType::float16: return CUDA_R_16F;
    default: detail::unsupported_dtype(op, t);
  }
}

void gemm_impl(const WorkerHandles& h, DType t, bool tf32, bool trans_a, bool trans_b, std::int64_t m,
               std::int64_t n, std::int64_t k, float alpha, const void* a, std::int64_t lda, const void* b,
               std::int64_t ldb, float beta, void* c, std::int64_t ldc, const char* op) {
  const cudaDataType_t type = cuda_type(t, op);
  if (m <= 0 || n <= 0) return;
  // cuBLAS would reject the leading dimensions of empty A/B; the product is
  // zero, so only the beta scaling of C remains.
  if (k <= 0 || alpha == 0.0f) return detail::scale_matrix(h, t, c, m, n, ldc, beta);
  WEFT_CUBLAS_CHECK(cublasSetStream(h.cublas, detail::cuda_stream(h)));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  if (t == DType::float32 && !tf32) {
    WEFT_CUBLAS_CHECK(cublasSgemm_64(h.cublas, op_b, op_a, n, m, k, &alpha, static_cast<const float*>(b), ldb,
                                     static_cast<const float*>(a), lda, &beta, static_cast<float*>(c), ldc));
    return;
  }
  const cublasComputeType_t compute = t == DType::float32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  WEFT_CUBLAS_CHECK(cublasGemmEx_64(h.cublas, op_b, op_a, n, m, k, &alpha, b, type, ldb, a, type, lda, &beta, c, type,
                                    ldc, compute, CUBLAS_GEMM_DEFAULT));
}

}  // namespace

void gemm(const WorkerHandles& h, DType t, bool tf32, bool trans_a, bool trans_b, std::int64_t m, std::int64_t n,
          std::int64_t k, float alpha, const void* a, std::int64_t lda, const void* b, std::int64_t ldb, float beta,
          void* c, std::int64_t ldc) {
  gemm_impl(h, t, tf32, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, "gemm");
}

void gemm_batched(const WorkerHandles& h, DType t, bool tf32, bool trans_a, bool trans_b, std::int64_t batch,
                  std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a, std::int64_t lda,
                  std::int64_t stride_a, const void* b, std::int64_t ldb, std::int64_t stride_b, float beta, void* c,
                  std::int64_t ldc, std::int64_t stride_c) {
  constexpr const char* op = "gemm_batched";
  const cudaDataType_t type = cuda_type(t, op);
  if (batch <= 0 || m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {
    // Empty products: C is beta C, one matrix after the other.
    const std::size_t elem = dtype_size(t);
    for (std::int64_t i = 0; i < batch; ++i)
      detail::scale_matrix(h, t, static_cast<unsigned char*>(c) + static_cast<std::size_t>(i * stride_c) * elem, m, n,
                           ldc, beta);
    return;
  }
  WEFT_CUBLAS_CHECK(cublasSetStream(h.cublas, detail::cuda_stream(h)));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Row-major C^T = op(B)^T op(A)^T, as gemm_impl.
  if (t == DType::float32 && !tf32) {
    WEFT_CUBLAS_CHECK(cublasSgemmStridedBatched_64(h.cublas, op_b, op_a, n, m, k, &alpha, static_cast<const float*>(b),
                                                   ldb, stride_b, static_cast<const float*>(a), lda, stride_a, &beta,
                                                   static_cast<float*>(c), ldc, stride_c, batch));
    return;
  }
  const cublasComputeType_t compute = t == DType::float32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  WEFT_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(h.cublas, op_b, op_a, n, m, k, &alpha, b, type, ldb, stride_b, a,
                                                  type, lda, stride_a, &beta, c, type, ldc, stride_c, batch, compute,
                                                  CUBLAS_GEMM_DEFAULT));
}

void detail::gemm_batched_float_out(const WorkerHandles& h, DType t, bool trans_a, bool trans_b, std::int64_t batch,
                                    std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
                                    std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
                                    std::int64_t stride_b, float beta, float* c, std::int64_t ldc,
                                    std::int64_t stride_c) {
  if (t == DType::float32)
    return gemm_batched(h, t, false, trans_a, trans_b, batch, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b,
                        beta, c, ldc, stride_c);
  constexpr const char* op = "gemm_batched_float_out";
  const cudaDataType_t type = cuda_type(t, op);
  if (batch <= 0 || m <= 0 || n <= 0) return;
  if (k <= 0 || alpha == 0.0f) {
    for (std::int64_t i = 0; i < batch; ++i) detail::scale_matrix(h, DType::float32, c + i * stride_c, m, n, ldc, beta);
    return;
  }
  WEFT_CUBLAS_CHECK(cublasSetStream(h.cublas, detail::cuda_stream(h)));
  const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  // Row-major C^T = op(B)^T op(A)^T, as gemm_impl.
  WEFT_CUBLAS_CHECK(cublasGemmStridedBatchedEx_64(h.cublas, op_b, op_a, n, m, k, &alpha, b, type, ldb, stride_b, a,
                                                  type, lda, stride_a, &beta, c, CUDA_R_32F, ldc, stride_c, batch,
                                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void dense_forward(const WorkerHandles& h, DType t, bool tf32, void* y, const void* x, const void* w, const void* b,
                   std::int64_t batch, std::int64_t in, std::int64_t out) {
  constexpr const char* op = "dense_forward";
  // y = x w^T: x is batch x in, w is out x in.
  if (b == nullptr || t == DType::float32) {
    gemm_impl(h, t, tf32, false, true, batch, out, in, 1.0f, x, in, w, in, 0.0f, y, out, op);
    if (b != nullptr) detail::add_row_bias(h, t, y, b, batch, out);
    return;
  }
  // Half data: y starts as the broadcast bias and the GEMM adds the product
  // (beta = 1), so the bias joins the float32 accumulator and y is rounded
  // once.
  cuda_type(t, op);
  detail::broadcast_rows(h, t, y, b, batch, out);
  gemm_impl(h, t, tf32, false, true, batch, out, in, 1.0f, x, in, w, in, 1.0f, y, out, op);
}

void dense_backward(const WorkerHandles& h, DType t, bool tf32, void* dx, void* dw, void* db, const void* x,
                    const void* w, const void* dy, std::int64_t batch, std::int64_t in, std::int64_t out) {
  constexpr const char* op = "dense_backward";
  cuda_type(t, op);
  // dx[batch, in] = dy[batch, out] w[out, in]
  if (dx != nullptr) gemm_impl(h, t, tf32, false, false, batch, in, out, 1.0f, dy, out, w, in, 0.0f, dx, in, op);
  // dw[out, in] = dy^T x
  if (dw != nullptr) gemm_impl(h, t, tf32, true, false, out, in, batch, 1.0f, dy, out, x, in, 0.0f, dw, in, op);
  // db = column sums of dy, accumulated in double.
  if (db != nullptr) detail::column_sums(h, t, db, dy, batch, out);
}

}  // namespace weft::kernels::gpu
