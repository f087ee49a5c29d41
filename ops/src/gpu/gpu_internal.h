// Helpers shared between the GPU kernel files. Plain C++ (no CUDA syntax) so
// the cuBLAS / cuDNN wrappers compiled by the host compiler can call kernels
// that live in .cu files. Typed helpers take the element type as a DType and
// void pointers, as the kernels of gpu_kernels.h do.
#pragma once

#include <cstdint>
#include <limits>
#include <string>

#include "weft/dtype.h"
#include "weft/error.h"
#include "weft/gpu.h"

struct CUstream_st;  // cudaStream_t

namespace weft::kernels::gpu::detail {

using weft::gpu::WorkerHandles;

// The CUDA stream of a worker: on the cuda backend a weft::gpu::Stream* is the
// cudaStream_t itself (devices/src/cuda_backend.cpp). These kernels run only
// there; simulated GPUs run the CPU kernels (ops/src/launch.h).
inline CUstream_st* cuda_stream(const WorkerHandles& h) noexcept { return reinterpret_cast<CUstream_st*>(h.stream); }

// cuDNN takes int dimensions; a silent wrap would compute on the wrong shape.
inline int to_int(std::int64_t v, const char* what, const char* op) {
  if (v < 0 || v > std::numeric_limits<int>::max())
    throw weft::Error(std::string(op) + ": " + what + " = " + std::to_string(v) +
                      " does not fit cuDNN's int dimensions");
  return static_cast<int>(v);
}

// A dtype the GPU kernels do not compute on.
[[noreturn]] inline void unsupported_dtype(const char* kernel, DType t) {
  throw weft::Error(std::string(kernel) + ": no GPU kernel for dtype " + std::string(to_string(t)) +
                    " (float32, bfloat16 and float16 have them)");
}

// y[n] = 0 in dtype t (all-zero bits; enqueued; n may be 0).
void zero(const WorkerHandles& h, DType t, void* y, std::int64_t n);
inline void zero(const WorkerHandles& h, float* y, std::int64_t n) { zero(h, DType::float32, y, n); }
// y[r * cols + c] += b[c], y and b of dtype t, the sum in float32.
void add_row_bias(const WorkerHandles& h, DType t, void* y, const void* b, std::int64_t rows, std::int64_t cols);
// y[r * cols + c] = b[c] (dtype t).
void broadcast_rows(const WorkerHandles& h, DType t, void* y, const void* b, std::int64_t rows, std::int64_t cols);
// y[c] = sum over r of x[r * cols + c], accumulated in double, y and x of
// dtype t; overwrites y, rows may be 0.
void column_sums(const WorkerHandles& h, DType t, void* y, const void* x, std::int64_t rows, std::int64_t cols);
// NCHW as [n, c, hw]: y[i, c, j] += b[c] (float32 sum, one rounding to t).
void add_channel_bias(const WorkerHandles& h, DType t, void* y, const void* b, std::int64_t n, std::int64_t c,
                      std::int64_t hw);
// db[c] = sum over i, j of dy[i, c, j], accumulated in double; overwrites db.
void channel_sums(const WorkerHandles& h, DType t, void* db, const void* dy, std::int64_t n, std::int64_t c,
                  std::int64_t hw);
// c[i * ldc + j] = beta * c[...] for an m x n block (beta == 0 writes zeros
// without reading c, as BLAS does): gemm with k == 0.
void scale_matrix(const WorkerHandles& h, DType t, void* c, std::int64_t m, std::int64_t n, std::int64_t ldc,
                  float beta);

// Strided-batched row-major C = alpha op(A) op(B) + beta C as gemm_batched,
// with A and B of dtype t and C float32 whatever t: strict float32 is
// cublasSgemm; bfloat16 and float16 are cublasGemmStridedBatchedEx with half
// inputs, a float32 output and float32 accumulation (attention's scores).
void gemm_batched_float_out(const WorkerHandles& h, DType t, bool trans_a, bool trans_b, std::int64_t batch,
                            std::int64_t m, std::int64_t n, std::int64_t k, float alpha, const void* a,
                            std::int64_t lda, std::int64_t stride_a, const void* b, std::int64_t ldb,
                            std::int64_t stride_b, float beta, float* c, std::int64_t ldc, std::int64_t stride_c);

// Two-pass reductions keep one double partial per block in h.workspace; this
// is how many fit (0 or 1 means: reduce in a single block instead, which is
// slower for big inputs but needs no scratch at all).
std::int64_t partial_slots(const WorkerHandles& h);
// *out (dtype t) = sum of partials[0, count) * scale, in one block.
void finish_partials(const WorkerHandles& h, const double* partials, std::int64_t count, double scale, DType t,
                     void* out);
inline void finish_partials(const WorkerHandles& h, const double* partials, std::int64_t count, double scale,
                            float* out) {
  finish_partials(h, partials, count, scale, DType::float32, out);
}

}  // namespace weft::kernels::gpu::detail
