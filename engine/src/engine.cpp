#include "weft/engine.h"

#include <mutex>

#include "engine_config.h"
#include "engine_life.h"
#include "naive_engine.h"
#include "threaded_engine.h"

namespace weft {

Engine::Engine() : profiler_(std::make_unique<Profiler>()), life_(std::make_shared<detail::EngineLife>()) {
  life_->engine = this;
}

Engine::~Engine() { close_shared_vars(); }  // the engines did it first thing; harmless twice

void Engine::close_shared_vars() noexcept {
  std::unique_lock lock(life_->mutex);
  life_->engine = nullptr;
}

std::unique_ptr<Engine> Engine::create(EngineConfig config) {
  detail::ResolvedConfig resolved = detail::resolve(config);
  if (resolved.kind == "naive") return std::make_unique<detail::NaiveEngine>(std::move(resolved));
  return std::make_unique<detail::ThreadedEngine>(std::move(resolved));
}

}  // namespace weft
