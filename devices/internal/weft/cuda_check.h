// The checked-call macros of the CUDA libraries (internal to Weft: CUDA code
// only). A failing call throws weft::DeviceError — weft::OutOfMemory for the
// libraries' allocation failures, weft::InvalidArgument for bad values —
// naming the call, its status, the file:line, and the op and device running
// on this thread (set by the engine around op bodies), e.g.
//   cublasSgemm(h.cublas, ...) failed: cuBLAS error 13 (CUBLAS_STATUS_EXECUTION_FAILED)
//   [ops/src/gpu/blas.cpp:41, op 'matmul' on gpu(0)]
// Include the library's own header before using its macro; this header
// includes none of them.
#pragma once

#include "weft/check_context.h"

#define WEFT_CUDA_CHECK(expr)                                                                     \
  WEFT_DETAIL_CHECK("CUDA", expr, cudaSuccess, cudaGetErrorName, [](cudaError_t s) {             \
    return s == cudaErrorMemoryAllocation ? ::weft::detail::Failure::out_of_memory               \
           : s == cudaErrorInvalidValue   ? ::weft::detail::Failure::invalid_argument            \
                                          : ::weft::detail::Failure::device;                     \
  })
#define WEFT_CUBLAS_CHECK(expr)                                                                       \
  WEFT_DETAIL_CHECK("cuBLAS", expr, CUBLAS_STATUS_SUCCESS, cublasGetStatusName, [](cublasStatus_t s) { \
    return s == CUBLAS_STATUS_ALLOC_FAILED    ? ::weft::detail::Failure::out_of_memory                 \
           : s == CUBLAS_STATUS_INVALID_VALUE ? ::weft::detail::Failure::invalid_argument              \
                                              : ::weft::detail::Failure::device;                       \
  })
#define WEFT_CUDNN_CHECK(expr)                                                                         \
  WEFT_DETAIL_CHECK("cuDNN", expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString, [](cudnnStatus_t s) {    \
    return s == CUDNN_STATUS_ALLOC_FAILED ? ::weft::detail::Failure::out_of_memory                     \
           : s == CUDNN_STATUS_BAD_PARAM  ? ::weft::detail::Failure::invalid_argument                  \
                                          : ::weft::detail::Failure::device;                           \
  })
#define WEFT_NCCL_CHECK(expr)                                                                  \
  WEFT_DETAIL_CHECK("NCCL", expr, ncclSuccess, ncclGetErrorString, [](ncclResult_t s) {       \
    return s == ncclInvalidArgument ? ::weft::detail::Failure::invalid_argument               \
                                    : ::weft::detail::Failure::device;                        \
  })
