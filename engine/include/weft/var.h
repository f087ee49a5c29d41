// weft::Var — a handle to an engine variable: a cheap, copyable value.
//
// A Var names something ops read or write (a tensor, a file, a counter); the
// engine orders ops by the Vars they touch and never looks at the data. A
// handle remembers its engine and the generation of its slot, so a Var used
// after delete_var, or with another engine, is caught at push time instead of
// silently aliasing a recycled variable. A Var lives until delete_var or the
// engine's end; weft::SharedVar (below) deletes it when its last copy goes.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

namespace weft {

class Engine;
class SharedVar;

namespace detail {
struct VarSlot;
struct VarAccess;
struct SharedVarState;
}  // namespace detail

class Var {
 public:
  constexpr Var() noexcept = default;  // the null Var: refused by every engine call

  constexpr bool is_null() const noexcept { return slot_ == nullptr; }
  // The variable's number within its engine, used in messages: "var #12".
  std::uint32_t id() const noexcept { return id_; }

  friend constexpr bool operator==(const Var&, const Var&) noexcept = default;

 private:
  friend struct detail::VarAccess;
  friend struct std::hash<Var>;
  detail::VarSlot* slot_ = nullptr;
  std::uint32_t id_ = 0;
  std::uint32_t generation_ = 0;
  std::uint32_t engine_id_ = 0;
};

// A read-only view of Vars: accepts a braced list, a std::vector<Var>, a
// std::array or a std::span alike. It does not own the Vars; engine calls copy
// what they keep before returning.
class VarList {
 public:
  constexpr VarList() noexcept = default;
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Winit-list-lifetime"  // a view: the list outlives the call it is passed to
#endif
  constexpr VarList(std::initializer_list<Var> vars) noexcept : data_(vars.begin()), size_(vars.size()) {}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
  VarList(const std::vector<Var>& vars) noexcept : data_(vars.data()), size_(vars.size()) {}  // NOLINT
  constexpr VarList(std::span<const Var> vars) noexcept : data_(vars.data()), size_(vars.size()) {}  // NOLINT
  template <std::size_t N>
  constexpr VarList(const std::array<Var, N>& vars) noexcept : data_(vars.data()), size_(N) {}  // NOLINT
  constexpr VarList(const Var& var) noexcept : data_(&var), size_(1) {}  // NOLINT: a lone Var is a list of one
  VarList(const SharedVar& var) noexcept;  // NOLINT: so is a lone SharedVar

  constexpr const Var* begin() const noexcept { return data_; }
  constexpr const Var* end() const noexcept { return data_ + size_; }
  constexpr std::size_t size() const noexcept { return size_; }
  constexpr bool empty() const noexcept { return size_ == 0; }
  constexpr const Var& operator[](std::size_t i) const noexcept { return data_[i]; }

 private:
  const Var* data_ = nullptr;
  std::size_t size_ = 0;
};

// An owning handle to a variable: copies share it, and when the last copy
// goes the variable is deleted through its engine (delete_var: after every
// op pushed on it so far). It converts to the Var it holds, so it goes
// wherever a Var does: `engine.push(fn, {a, b}, {c})`. Dropping the last copy
// is safe on any thread, inside an op, and after or during the engine's
// destruction (the engine's end then takes the variable with it). Deleting
// its Var by hand as well is a misuse, reported on stderr when the handle
// goes.
class SharedVar {
 public:
  SharedVar() noexcept = default;  // empty: holds the null Var
  // A new variable of `engine` (engine.new_var(name)).
  explicit SharedVar(Engine& engine, std::string_view name = {});
  // Takes ownership of `var`, a live variable of `engine`.
  static SharedVar adopt(Engine& engine, Var var);

  const Var& var() const noexcept;
  operator const Var&() const noexcept { return var(); }  // NOLINT: a SharedVar is used as its Var
  explicit operator bool() const noexcept { return state_ != nullptr; }
  long use_count() const noexcept { return state_.use_count(); }
  void reset() noexcept { state_.reset(); }  // drops this copy

 private:
  std::shared_ptr<detail::SharedVarState> state_;
};

inline VarList::VarList(const SharedVar& var) noexcept : data_(&var.var()), size_(1) {}

}  // namespace weft

template <>
struct std::hash<weft::Var> {
  std::size_t operator()(const weft::Var& v) const noexcept {
    return std::hash<const void*>()(v.slot_) ^ (static_cast<std::size_t>(v.generation_) << 1);
  }
};
