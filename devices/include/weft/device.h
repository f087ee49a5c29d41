// weft::Device — where an op runs: a small hashable value type (kind + index).
//
// Devices are plain values: comparing, hashing and copying them is free, and a
// Device says nothing about whether it exists. The engine checks existence at
// push time (an unknown device is a weft::Error naming it).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <string>
#include <string_view>

namespace weft {

enum class DeviceKind : std::uint8_t {
  cpu = 0,         // a CPU worker pool; several can exist on one machine
  cpu_pinned = 1,  // page-locked host memory, staging area for GPU copies
  gpu = 2,
};

std::string_view to_string(DeviceKind kind) noexcept;

class Device {
 public:
  constexpr Device() noexcept = default;  // cpu(0)
  // Throws weft::Error when index is negative or too large.
  Device(DeviceKind kind, int index);

  static Device cpu(int index = 0) { return Device(DeviceKind::cpu, index); }
  static Device cpu_pinned(int index = 0) { return Device(DeviceKind::cpu_pinned, index); }
  static Device gpu(int index = 0) { return Device(DeviceKind::gpu, index); }

  // Accepts "cpu", "cpu:1", "cpu(1)", "gpu:0", "cpu_pinned:0"; throws weft::Error
  // naming the text otherwise.
  static Device parse(std::string_view text);

  constexpr DeviceKind kind() const noexcept { return kind_; }
  constexpr int index() const noexcept { return index_; }
  constexpr bool is_cpu() const noexcept { return kind_ == DeviceKind::cpu; }
  constexpr bool is_gpu() const noexcept { return kind_ == DeviceKind::gpu; }

  std::string str() const;  // "cpu(0)", "gpu(1)", "cpu_pinned(0)"

  friend constexpr bool operator==(Device, Device) noexcept = default;
  friend constexpr auto operator<=>(Device, Device) noexcept = default;

 private:
  DeviceKind kind_ = DeviceKind::cpu;
  std::int16_t index_ = 0;
};

std::ostream& operator<<(std::ostream& os, Device d);

// The CPUs this process may run on: the size of the calling thread's affinity
// mask (taskset, a container's cpuset, mpirun's --bind-to), else the hardware
// threads; at least 1. std::thread::hardware_concurrency() counts every CPU
// of the machine, so a rank bound to one core would start a worker per core
// of the machine on it. The default number of workers per CPU device
// (EngineConfig) and of intra-op threads (weft/ops.h).
int available_cpus() noexcept;

}  // namespace weft

template <>
struct std::hash<weft::Device> {
  std::size_t operator()(weft::Device d) const noexcept {
    return (static_cast<std::size_t>(d.kind()) << 16) ^ static_cast<std::size_t>(static_cast<std::uint16_t>(d.index()));
  }
};
