#include <string>

#include "weft/check_context.h"
#include "weft/error.h"

namespace weft::detail {

std::string current_op_suffix() {
  const CheckContext* ctx = tls_check_context;
  if (!ctx) return {};
  return ", op '" + std::string(ctx->op.empty() ? "(unnamed)" : ctx->op) + "' on " + ctx->device.str();
}

std::string call_failure_message(const char* library, const char* call, long long code, std::string_view status_text,
                                 const char* file, int line) {
  std::string message = std::string(call) + " failed: " + library + " error " + std::to_string(code) + " (" +
                        std::string(status_text) + ")";
  if (file) message += " [" + std::string(file) + ":" + std::to_string(line) + current_op_suffix() + "]";
  return message;
}

void throw_call_failure(const char* library, const char* call, const char* file, int line, long long code,
                        std::string_view status_text, CallFailure failure) {
  const std::string message = call_failure_message(library, call, code, status_text, file, line);
  switch (failure.kind) {
    case Failure::out_of_memory: {
      const Device device = tls_check_context ? tls_check_context->device : Device();
      throw OutOfMemory(message, device, 0, 0);
    }
    case Failure::invalid_argument: throw InvalidArgument(message);
    case Failure::communication: throw CommunicationError(message, failure.rank, failure.peer);
    case Failure::device: break;
  }
  throw DeviceError(message);
}

}  // namespace weft::detail
