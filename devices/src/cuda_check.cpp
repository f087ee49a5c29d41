#include "weft/cuda_check.h"

#include <string>

#include "weft/error.h"

namespace weft::detail {

void throw_call_failure(const char* library, const char* call, const char* file, int line, long long code,
                        const char* status_text) {
  std::string where = std::string(file) + ":" + std::to_string(line);
  if (const CheckContext* ctx = tls_check_context)
    where += ", op '" + std::string(ctx->op.empty() ? "(unnamed)" : ctx->op) + "' on " + ctx->device.str();
  throw Error(std::string(call) + " failed: " + library + " error " + std::to_string(code) + " (" +
              (status_text ? status_text : "?") + ") [" + where + "]");
}

}  // namespace weft::detail
