// What a Communicator shares among its copies (internal to parallel/).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "weft/device.h"
#include "weft/engine.h"

namespace weft::parallel {
class Communicator;

namespace detail {

struct CommunicatorState {
  Engine* engine = nullptr;
  std::vector<Device> devices;  // member r's device
  std::vector<int> local_ranks;
  std::atomic<std::uint64_t> sequence{0};  // collectives pushed so far (names them: "#3")
};

}  // namespace detail

const std::shared_ptr<detail::CommunicatorState>& state_of(const Communicator& comm) noexcept;

}  // namespace weft::parallel
