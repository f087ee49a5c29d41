#include <string>

#include "weft/check_context.h"
#include "weft/error.h"

namespace weft::detail {

std::string current_op_suffix() {
  const CheckContext* ctx = tls_check_context;
  if (!ctx) return {};
  return ", op '" + std::string(ctx->op.empty() ? "(unnamed)" : ctx->op) + "' on " + ctx->device.str();
}

void throw_call_failure(const char* library, const char* call, const char* file, int line, long long code,
                        const char* status_text, Failure failure) {
  const std::string message = std::string(call) + " failed: " + library + " error " + std::to_string(code) + " (" +
                              (status_text ? status_text : "?") + ") [" + file + ":" + std::to_string(line) +
                              current_op_suffix() + "]";
  switch (failure) {
    case Failure::out_of_memory: {
      const Device device = tls_check_context ? tls_check_context->device : Device();
      throw OutOfMemory(message, device, 0, 0);
    }
    case Failure::invalid_argument: throw InvalidArgument(message);
    case Failure::device: break;
  }
  throw DeviceError(message);
}

}  // namespace weft::detail
