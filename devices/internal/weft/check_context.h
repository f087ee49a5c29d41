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
enum class Failure { device, out_of_memory, invalid_argument, communication };

// A failed call's Failure and, for Failure::communication, the ranks the
// weft::CommunicationError names (-1: not known).
struct CallFailure {
  // Implicit: a mapping may return a plain Failure.
  CallFailure(Failure kind = Failure::device, int rank = -1, int peer = -1) noexcept
      : kind(kind), rank(rank), peer(peer) {}
  Failure kind;
  int rank, peer;
};

// The one message of a failed call:
//   "<call> failed: <library> error <code> (<status text>) [<file>:<line>, op 'x' on gpu(0)]"
// without the bracket where no file is given (a failure handled where it
// happened, off any op: the status is all there is to say).
std::string call_failure_message(const char* library, const char* call, long long code, std::string_view status_text,
                                 const char* file = nullptr, int line = 0);

// Throws weft::DeviceError (or OutOfMemory / InvalidArgument /
// CommunicationError as `failure` says) with call_failure_message.
[[noreturn]] void throw_call_failure(const char* library, const char* call, const char* file, int line,
                                     long long code, std::string_view status_text, CallFailure failure = {});

// A library's status text, as text_of returns it (a C string, possibly
// null, or a std::string that lives until the end of the full expression).
inline std::string_view status_text(const char* text) noexcept { return text ? text : "?"; }
inline std::string_view status_text(const std::string& text) noexcept { return text; }

}  // namespace weft::detail

// The one checked-call macro family: every library's macro is this one with
// the call's text, its failure test, its status-to-text function and its
// status-to-Failure (or CallFailure) mapping (weft/checked_call.h defines
// CUDA's, cuBLAS's, cuDNN's, NCCL's and MPI's). The library macros pass
// #expr themselves, so that the message shows the call as written, before
// its arguments' macros (MPI_COMM_WORLD, ...) expand.
#define WEFT_DETAIL_CHECKED_CALL(library, call_text, expr, failed, text_of, failure_of)                      \
  do {                                                                                                       \
    const auto weft_status_ = (expr);                                                                        \
    if ((failed)(weft_status_))                                                                              \
      ::weft::detail::throw_call_failure(library, call_text, __FILE__, __LINE__,                             \
                                         static_cast<long long>(weft_status_),                               \
                                         ::weft::detail::status_text(text_of(weft_status_)),                 \
                                         failure_of(weft_status_));                                          \
  } while (0)
// The common case: one success value.
#define WEFT_DETAIL_CHECK(library, expr, ok, text_of, failure_of)                                    \
  WEFT_DETAIL_CHECKED_CALL(library, #expr, expr, [](const auto& weft_s_) { return weft_s_ != (ok); }, \
                           text_of, failure_of)
