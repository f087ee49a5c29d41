// Which op runs on this thread, for error messages, and the one function the
// checked-call macros throw through. Internal to Weft (not installed): the
// engine sets the context around op bodies; devices/ and ops/ name it in the
// errors they raise.
#pragma once

#include <string>
#include <string_view>

#include "weft/device.h"

namespace weft::detail {

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

// ", op 'matmul' on gpu(0)" for the op running on this thread, else "".
std::string current_op_suffix();

// What a failed call's status means to the caller: the exception type thrown.
enum class Failure { device, out_of_memory, invalid_argument };

// Throws weft::DeviceError (or OutOfMemory / InvalidArgument as `failure`
// says) naming the call, the library's status, file:line and the op.
[[noreturn]] void throw_call_failure(const char* library, const char* call, const char* file, int line,
                                     long long code, const char* status_text, Failure failure = Failure::device);

}  // namespace weft::detail

// The one checked-call macro family: every library's macro is this one with
// its success value, its status-to-text function and its status-to-Failure
// mapping (weft/cuda_check.h defines CUDA's, cuBLAS's, cuDNN's and NCCL's).
#define WEFT_DETAIL_CHECK(library, expr, ok, text_of, failure_of)                                           \
  do {                                                                                                       \
    const auto weft_status_ = (expr);                                                                        \
    if (weft_status_ != (ok))                                                                                \
      ::weft::detail::throw_call_failure(library, #expr, __FILE__, __LINE__,                                 \
                                         static_cast<long long>(weft_status_), text_of(weft_status_),        \
                                         failure_of(weft_status_));                                          \
  } while (0)
