#include "weft/device.h"

#include <charconv>
#include <limits>
#include <ostream>
#include <thread>

#include <sched.h>

#include "weft/error.h"

namespace weft {

std::string_view to_string(DeviceKind kind) noexcept {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cpu_pinned: return "cpu_pinned";
    case DeviceKind::gpu: return "gpu";
  }
  return "unknown";
}

Device::Device(DeviceKind kind, int index) : kind_(kind) {
  if (index < 0 || index > std::numeric_limits<std::int16_t>::max())
    throw InvalidArgument("weft::Device: index " + std::to_string(index) + " for a " + std::string(to_string(kind)) +
                " device is out of range [0, 32767]");
  index_ = static_cast<std::int16_t>(index);
}

Device Device::parse(std::string_view text) {
  auto fail = [&]() -> Device {
    throw InvalidArgument("weft::Device::parse: '" + std::string(text) +
                "' is not a device; expected cpu, cpu:N, cpu(N), cpu_pinned:N or gpu:N");
  };
  std::string_view name = text;
  std::string_view number;
  if (auto colon = text.find(':'); colon != std::string_view::npos) {
    name = text.substr(0, colon);
    number = text.substr(colon + 1);
  } else if (auto paren = text.find('('); paren != std::string_view::npos) {
    if (text.back() != ')') return fail();
    name = text.substr(0, paren);
    number = text.substr(paren + 1, text.size() - paren - 2);
  }
  DeviceKind kind;
  if (name == "cpu") kind = DeviceKind::cpu;
  else if (name == "gpu" || name == "cuda") kind = DeviceKind::gpu;
  else if (name == "cpu_pinned") kind = DeviceKind::cpu_pinned;
  else return fail();
  int index = 0;
  if (!number.empty()) {
    auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), index);
    if (ec != std::errc() || end != number.data() + number.size()) return fail();
  } else if (name.size() != text.size()) {
    return fail();  // "cpu:" or "cpu()"
  }
  return Device(kind, index);
}

std::string Device::str() const {
  return std::string(to_string(kind_)) + "(" + std::to_string(index_) + ")";
}

std::ostream& operator<<(std::ostream& os, Device d) { return os << d.str(); }

int available_cpus() noexcept {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) == 0) {
    const int n = CPU_COUNT(&mask);
    if (n > 0) return n;
  }
  // More CPUs than a cpu_set_t holds (1024), or no affinity support.
  const unsigned hardware = std::thread::hardware_concurrency();
  return hardware > 0 ? static_cast<int>(hardware) : 1;
}

}  // namespace weft
