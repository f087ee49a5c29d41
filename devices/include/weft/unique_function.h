// weft::UniqueFunction — a move-only callable with inline storage.
//
// Why not std::function: it must be copyable (so lambdas holding move-only
// state are refused) and libstdc++ stores only 16 bytes inline, so a typical
// op lambda (a few pointers and sizes) would allocate on every push. Ops are
// stored inside pooled op blocks; a 56-byte buffer keeps the steady-state push
// path free of allocation for all but unusually fat captures.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <new>
#include <type_traits>
#include <utility>

namespace weft {

template <class Signature, std::size_t InlineBytes = 56>
class UniqueFunction;

template <class R, class... Args, std::size_t InlineBytes>
class UniqueFunction<R(Args...), InlineBytes> {
 public:
  UniqueFunction() noexcept = default;
  UniqueFunction(std::nullptr_t) noexcept {}

  template <class F>
    requires(!std::is_same_v<std::remove_cvref_t<F>, UniqueFunction> && std::is_invocable_r_v<R, F&, Args...>)
  UniqueFunction(F&& f) {  // NOLINT(google-explicit-constructor): callables convert like std::function
    using D = std::decay_t<F>;
    if constexpr (std::is_pointer_v<D> || std::is_member_pointer_v<D> || requires(const D& d) { d == nullptr; }) {
      if (f == nullptr) return;  // a null pointer or an empty std::function stays empty here too
    }
    if constexpr (fits_inline<D>) {
      ::new (static_cast<void*>(storage_)) D(std::forward<F>(f));
      ops_ = &inline_ops<D>;
    } else {
      *reinterpret_cast<D**>(storage_) = new D(std::forward<F>(f));
      ops_ = &heap_ops<D>;
    }
  }

  UniqueFunction(UniqueFunction&& other) noexcept { take(other); }
  UniqueFunction& operator=(UniqueFunction&& other) noexcept {
    if (this != &other) {
      reset();
      take(other);
    }
    return *this;
  }
  UniqueFunction& operator=(std::nullptr_t) noexcept {
    reset();
    return *this;
  }
  UniqueFunction(const UniqueFunction&) = delete;
  UniqueFunction& operator=(const UniqueFunction&) = delete;
  ~UniqueFunction() { reset(); }

  explicit operator bool() const noexcept { return ops_ != nullptr; }

  R operator()(Args... args) { return ops_->invoke(storage_, std::forward<Args>(args)...); }

  void reset() noexcept {
    if (ops_) {
      ops_->destroy(storage_);
      ops_ = nullptr;
    }
  }

  // True when the callable lives in the inline buffer (no heap allocation).
  bool is_inline() const noexcept { return ops_ && ops_->inline_storage; }

 private:
  struct Ops {
    R (*invoke)(void*, Args&&...);
    void (*move_to)(void* from, void* to) noexcept;  // move-construct into `to`, destroy `from`
    void (*destroy)(void*) noexcept;
    bool inline_storage;
  };

  template <class D>
  static constexpr bool fits_inline = sizeof(D) <= InlineBytes && alignof(D) <= alignof(std::max_align_t) &&
                                      std::is_nothrow_move_constructible_v<D>;

  template <class D>
  static constexpr Ops inline_ops{
      [](void* s, Args&&... a) -> R { return std::invoke(*std::launder(static_cast<D*>(s)), std::forward<Args>(a)...); },
      [](void* from, void* to) noexcept {
        D* f = std::launder(static_cast<D*>(from));
        ::new (to) D(std::move(*f));
        f->~D();
      },
      [](void* s) noexcept { std::launder(static_cast<D*>(s))->~D(); },
      true};

  template <class D>
  static constexpr Ops heap_ops{
      [](void* s, Args&&... a) -> R { return std::invoke(**static_cast<D**>(s), std::forward<Args>(a)...); },
      [](void* from, void* to) noexcept { *static_cast<D**>(to) = *static_cast<D**>(from); },
      [](void* s) noexcept { delete *static_cast<D**>(s); },
      false};

  void take(UniqueFunction& other) noexcept {
    if (other.ops_) {
      other.ops_->move_to(other.storage_, storage_);
      ops_ = other.ops_;
      other.ops_ = nullptr;
    }
  }

  alignas(std::max_align_t) unsigned char storage_[InlineBytes];
  const Ops* ops_ = nullptr;
};

}  // namespace weft
