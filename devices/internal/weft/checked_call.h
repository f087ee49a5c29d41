// The checked-call macros of the libraries Weft calls (internal to Weft).
// A failing call throws a weft::Error naming the call as written, the
// library's status and text, the file:line, and the op and device running
// on this thread (set by the engine around op bodies), e.g.
//   cublasSgemm(h.cublas, ...) failed: cuBLAS error 13 (CUBLAS_STATUS_EXECUTION_FAILED)
//   [ops/src/gpu/blas.cpp:41, op 'matmul' on gpu(0)]
// The kind: weft::OutOfMemory for allocation failures, weft::InvalidArgument
// for bad values, weft::CommunicationError for MPI and NCCL (with this
// process's MPI rank where MPI knows it), weft::DeviceError otherwise.
// WEFT_MPI_FAILURE gives the same message without throwing, for a failure
// handled where it happened. Include the library's own header before using
// its macro; this header includes none of them.
#pragma once

#include <string>

#include "weft/check_context.h"

#define WEFT_CUDA_CHECK(expr)                                                                         \
  WEFT_DETAIL_CHECKED_CALL("CUDA", #expr, expr, [](cudaError_t s) { return s != cudaSuccess; },       \
                           cudaGetErrorName, [](cudaError_t s) {                                      \
                             return s == cudaErrorMemoryAllocation ? ::weft::detail::Failure::out_of_memory    \
                                    : s == cudaErrorInvalidValue   ? ::weft::detail::Failure::invalid_argument \
                                                                   : ::weft::detail::Failure::device;          \
                           })
#define WEFT_CUBLAS_CHECK(expr)                                                                              \
  WEFT_DETAIL_CHECKED_CALL("cuBLAS", #expr, expr, [](cublasStatus_t s) { return s != CUBLAS_STATUS_SUCCESS; }, \
                           cublasGetStatusName, [](cublasStatus_t s) {                                       \
                             return s == CUBLAS_STATUS_ALLOC_FAILED    ? ::weft::detail::Failure::out_of_memory    \
                                    : s == CUBLAS_STATUS_INVALID_VALUE ? ::weft::detail::Failure::invalid_argument \
                                                                       : ::weft::detail::Failure::device;          \
                           })
#define WEFT_CUDNN_CHECK(expr)                                                                             \
  WEFT_DETAIL_CHECKED_CALL("cuDNN", #expr, expr, [](cudnnStatus_t s) { return s != CUDNN_STATUS_SUCCESS; }, \
                           cudnnGetErrorString, [](cudnnStatus_t s) {                                      \
                             return s == CUDNN_STATUS_ALLOC_FAILED ? ::weft::detail::Failure::out_of_memory    \
                                    : s == CUDNN_STATUS_BAD_PARAM  ? ::weft::detail::Failure::invalid_argument \
                                                                   : ::weft::detail::Failure::device;          \
                           })
// ncclInProgress is not a failure: a non-blocking communicator is still at
// work. The text adds NCCL's last error message (what went wrong, where).
#define WEFT_NCCL_CHECK(expr)                                                                           \
  WEFT_DETAIL_CHECKED_CALL(                                                                            \
      "NCCL", #expr, expr, [](ncclResult_t s) { return s != ncclSuccess && s != ncclInProgress; },     \
      ([](ncclResult_t s) {                                                                            \
        std::string text = ncclGetErrorString(s);                                                      \
        if (const char* last = ncclGetLastError(nullptr); last && *last) text.append(": ").append(last); \
        return text;                                                                                   \
      }),                                                                                              \
      [](ncclResult_t s) {                                                                             \
        return s == ncclInvalidArgument ? ::weft::detail::Failure::invalid_argument                    \
                                        : ::weft::detail::Failure::communication;                      \
      })

// MPI: MPI_Error_string's text; the CommunicationError names this process's
// rank in MPI_COMM_WORLD where MPI is up (else -1). The communicator must
// return errors (MPI_ERRORS_RETURN; MPI_COMM_WORLD's default aborts).
#define WEFT_MPI_CHECK(expr)                                                                   \
  WEFT_DETAIL_CHECKED_CALL("MPI", #expr, expr, [](int s) { return s != MPI_SUCCESS; },          \
                           WEFT_DETAIL_MPI_TEXT, [](int) {                                     \
                             return ::weft::detail::CallFailure(::weft::detail::Failure::communication, \
                                                                WEFT_DETAIL_MPI_RANK());       \
                           })
// The message WEFT_MPI_CHECK would throw for `code` returned by `call` (a C
// string naming it), without the file:line: for a failure handled where it
// happened (a fiber failing its collective instead of throwing).
#define WEFT_MPI_FAILURE(call, code) \
  ::weft::detail::call_failure_message("MPI", call, code, WEFT_DETAIL_MPI_TEXT(code))

#define WEFT_DETAIL_MPI_TEXT(code)                                                      \
  ([](int weft_code_) {                                                                 \
    char weft_text_[MPI_MAX_ERROR_STRING];                                              \
    int weft_length_ = 0;                                                               \
    if (MPI_Error_string(weft_code_, weft_text_, &weft_length_) != MPI_SUCCESS) return std::string("?"); \
    return std::string(weft_text_, static_cast<std::size_t>(weft_length_));            \
  }(code))
#define WEFT_DETAIL_MPI_RANK()                                \
  ([] {                                                       \
    int weft_up_ = 0, weft_down_ = 0, weft_rank_ = -1;        \
    MPI_Initialized(&weft_up_);                               \
    MPI_Finalized(&weft_down_);                               \
    if (weft_up_ && !weft_down_) MPI_Comm_rank(MPI_COMM_WORLD, &weft_rank_); \
    return weft_rank_;                                        \
  }())
