// One checked-call macro family for CUDA, cuBLAS, cuDNN and NCCL. A failing
// call throws weft::Error naming the call, its status, the file:line, and the
// op and device running on this thread (set by the engine around op bodies),
// e.g.
//   cublasSgemm(h.cublas, ...) failed: CUBLAS_STATUS_EXECUTION_FAILED
//   [ops/src/gpu/blas.cu:41, op 'matmul' on gpu(0)]
// Include the library's own header before using its macro; this header
// includes none of them, so it is safe anywhere.
#pragma once

#include <string_view>

#include "weft/device.h"

namespace weft::detail {

// Which op this thread runs, for error messages (empty outside op bodies).
struct CheckContext {
  std::string_view op;
  Device device;
};
// The context of the op running on this thread; null outside ops. A pointer
// (set and restored by the guard on every op) keeps the per-op cost at two
// thread-local stores.
inline thread_local const CheckContext* tls_check_context = nullptr;

class CheckContextGuard {
 public:
  CheckContextGuard(std::string_view op, Device device) noexcept
      : context_{op, device}, saved_(tls_check_context) {
    tls_check_context = &context_;
  }
  ~CheckContextGuard() { tls_check_context = saved_; }
  CheckContextGuard(const CheckContextGuard&) = delete;
  CheckContextGuard& operator=(const CheckContextGuard&) = delete;

 private:
  CheckContext context_;
  const CheckContext* saved_;
};

[[noreturn]] void throw_call_failure(const char* library, const char* call, const char* file, int line,
                                     long long code, const char* status_text);

}  // namespace weft::detail

#define WEFT_DETAIL_CHECK(library, expr, ok, text_of)                                                        \
  do {                                                                                                       \
    const auto weft_status_ = (expr);                                                                        \
    if (weft_status_ != (ok))                                                                                \
      ::weft::detail::throw_call_failure(library, #expr, __FILE__, __LINE__,                                 \
                                         static_cast<long long>(weft_status_), text_of(weft_status_));       \
  } while (0)

#define WEFT_CUDA_CHECK(expr) WEFT_DETAIL_CHECK("CUDA", expr, cudaSuccess, cudaGetErrorName)
#define WEFT_CUBLAS_CHECK(expr) WEFT_DETAIL_CHECK("cuBLAS", expr, CUBLAS_STATUS_SUCCESS, cublasGetStatusName)
#define WEFT_CUDNN_CHECK(expr) WEFT_DETAIL_CHECK("cuDNN", expr, CUDNN_STATUS_SUCCESS, cudnnGetErrorString)
#define WEFT_NCCL_CHECK(expr) WEFT_DETAIL_CHECK("NCCL", expr, ncclSuccess, ncclGetErrorString)
