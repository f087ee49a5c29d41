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
  const ConvAlgo algo = resolved.conv_algo;
  std::unique_ptr<Engine> engine;
  if (resolved.kind == "naive") engine = std::make_unique<detail::NaiveEngine>(std::move(resolved));
  else engine = std::make_unique<detail::ThreadedEngine>(std::move(resolved));
  engine->set_conv_algo(algo);
  return engine;
}

ConvAlgo Engine::conv_algo() const noexcept {
  const unsigned bits = conv_algo_.load(std::memory_order_relaxed);
  return ConvAlgo{(bits & 1u) != 0, (bits & 2u) != 0};
}

void Engine::set_conv_algo(ConvAlgo algo) noexcept {
  conv_algo_.store(static_cast<std::uint8_t>((algo.benchmark ? 1u : 0u) | (algo.deterministic ? 2u : 0u)),
                   std::memory_order_relaxed);
}

}  // namespace weft
