// What weft::SharedVar handles hold of their engine (shared_var.cpp): the
// engine while it lives, null once it began to end. Releases take the lock
// shared, closing takes it exclusively.
#pragma once

#include <shared_mutex>

namespace weft {
class Engine;
}

namespace weft::detail {

struct EngineLife {
  std::shared_mutex mutex;
  Engine* engine = nullptr;
};

}  // namespace weft::detail
