// weft::Completion — how an async op says it is done.
//
// push_async hands the op a Completion; the op (or any thread it hands the
// Completion to) calls done() or done(std::current_exception()) exactly once.
// Copies share one completion. Calling it twice is a weft::Error; dropping the
// last copy without calling it completes the op with a weft::Error naming it,
// so a forgotten callback shows up as an error at the next wait instead of a
// hang. Called outside any op body, done() may run, before it returns, the
// bodies of inline ops it makes ready (OpOptions::run_inline): do not call it
// holding a lock such a body takes.
#pragma once

#include <exception>
#include <utility>

namespace weft {

namespace detail {
class CompletionTarget {
 public:
  virtual void completion_retain() noexcept = 0;
  // Dropping the last reference of a never-called completion completes the op
  // with an error.
  virtual void completion_release() noexcept = 0;
  // Throws weft::Error when called a second time.
  virtual void completion_call(std::exception_ptr error) = 0;

 protected:
  ~CompletionTarget() = default;
};
}  // namespace detail

class Completion {
 public:
  Completion() noexcept = default;
  // Adopts one reference already taken on `target`.
  explicit Completion(detail::CompletionTarget* target) noexcept : target_(target) {}
  Completion(const Completion& other) noexcept : target_(other.target_) {
    if (target_) target_->completion_retain();
  }
  Completion(Completion&& other) noexcept : target_(std::exchange(other.target_, nullptr)) {}
  Completion& operator=(Completion other) noexcept {
    std::swap(target_, other.target_);
    return *this;
  }
  ~Completion() {
    if (target_) target_->completion_release();
  }

  explicit operator bool() const noexcept { return target_ != nullptr; }

  void operator()() const { call(nullptr); }
  void operator()(std::exception_ptr error) const { call(std::move(error)); }

 private:
  void call(std::exception_ptr error) const;
  detail::CompletionTarget* target_ = nullptr;
};

}  // namespace weft
