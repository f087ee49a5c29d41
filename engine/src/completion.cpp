#include "weft/completion.h"

#include "op_block.h"
#include "weft/error.h"

namespace weft {

void Completion::call(std::exception_ptr error) const {
  if (!target_) throw InvalidArgument("weft::Completion: called on an empty Completion (default-constructed or moved from)");
  target_->completion_call(std::move(error));
}

namespace detail {

void AsyncCompletion::completion_call(std::exception_ptr error) {
  if (called_.exchange(true, std::memory_order_acq_rel))
    throw OpError("weft::Completion of op '" + name_ + "' on " + device_.str() + " called twice (or after the op threw)",
                  name_, device_);
  owner_->complete_async(op_, std::move(error));
}

void AsyncCompletion::completion_release() noexcept {
  if (refs_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  // The last reference is gone: an op nobody completed would hang its
  // waiters, so it completes with an error instead. The op is still pending
  // here, which keeps its engine alive.
  if (claim()) {
    owner_->complete_async(
        op_, std::make_exception_ptr(OpError("weft: the Completion of async op '" + name_ + "' on " + device_.str() +
                                                 " was destroyed without being called; the op is marked failed",
                                             name_, device_)));
  }
  delete this;
}

namespace {
thread_local const OpScope* tls_scope = nullptr;
}

const OpScope* current_op_scope() noexcept { return tls_scope; }

OpScopeGuard::OpScopeGuard(const void* engine, const std::string* name, Device device, std::uint8_t epoch) noexcept
    : scope_{engine, name, device, epoch, tls_scope} {
  tls_scope = &scope_;
}

OpScopeGuard::~OpScopeGuard() { tls_scope = scope_.outer; }

const OpScope* running_op_of(const void* engine) noexcept {
  for (const OpScope* s = tls_scope; s; s = s->outer)
    if (s->engine == engine) return s;
  return nullptr;
}

}  // namespace detail
}  // namespace weft
