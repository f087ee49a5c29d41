#include "weft/engine.h"

#include "engine_config.h"
#include "naive_engine.h"
#include "threaded_engine.h"

namespace weft {

Engine::Engine() : profiler_(std::make_unique<Profiler>()) {}
Engine::~Engine() = default;

std::unique_ptr<Engine> Engine::create(EngineConfig config) {
  detail::ResolvedConfig resolved = detail::resolve(config);
  if (resolved.kind == "naive") return std::make_unique<detail::NaiveEngine>(std::move(resolved));
  return std::make_unique<detail::ThreadedEngine>(std::move(resolved));
}

}  // namespace weft
