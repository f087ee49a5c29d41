// weft::SharedVar: the variable is deleted through its engine when the last
// handle goes. Handles reach the engine through an EngineLife the engine
// closes first thing in its destructor: a handle dropped after that (or after
// the engine is gone) leaves its variable to the engine's end. Releases take
// the life's lock shared, so handles dropped on many threads (and inside ops,
// while a frontend holds it blocked on the in-flight bound) never wait for
// one another; only closing takes it exclusively.
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <utility>

#include "engine_life.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/var.h"

namespace weft {
namespace detail {

struct SharedVarState {
  std::shared_ptr<EngineLife> life;
  Var var;

  SharedVarState(std::shared_ptr<EngineLife> l, Var v) noexcept : life(std::move(l)), var(v) {}
  SharedVarState(const SharedVarState&) = delete;
  SharedVarState& operator=(const SharedVarState&) = delete;
  ~SharedVarState() {
    if (var.is_null()) return;  // new_var threw
    std::shared_lock lock(life->mutex);
    if (life->engine == nullptr) return;
    try {
      life->engine->delete_var(var);
    } catch (const std::exception& e) {
      // Only a misuse gets here: the Var was deleted by hand as well.
      std::fprintf(stderr, "weft: dropping a SharedVar: %s\n", e.what());
    }
  }
};

}  // namespace detail

SharedVar::SharedVar(Engine& engine, std::string_view name)
    : state_(std::make_shared<detail::SharedVarState>(engine.life_, Var())) {
  state_->var = engine.new_var(name);  // after the allocation: nothing to leak if it throws
}

SharedVar SharedVar::adopt(Engine& engine, Var var) {
  if (var.is_null()) throw InvalidArgument("weft::SharedVar::adopt: null weft::Var");
  (void)engine.version(var);  // throws InvalidArgument for a deleted or foreign Var, naming it
  SharedVar out;
  out.state_ = std::make_shared<detail::SharedVarState>(engine.life_, var);
  return out;
}

const Var& SharedVar::var() const noexcept {
  static constexpr Var kNull{};
  return state_ ? state_->var : kNull;
}

}  // namespace weft
