// NVTX ranges, so that Nsight Systems shows Weft's op names: each push is a
// range in the "weft push" domain on the pushing thread, and each op's run a
// range in its device's domain ("weft cpu(0)", "weft gpu(1)") on the worker,
// coloured by op kind. NVTX is header-only and costs a pointer check per call
// when no tool is attached; builds without the CUDA toolkit compile it out.
#pragma once

#include <cstdint>
#include <vector>
#include <string>

#include "weft/device.h"
#include "weft/op_property.h"

#if WEFT_HAVE_NVTX
#include <nvtx3/nvToolsExt.h>
#endif

namespace weft::detail {

#if WEFT_HAVE_NVTX

inline std::uint32_t nvtx_colour(OpProperty property) {
  switch (property) {
    case OpProperty::normal: return 0xFF4C72B0;            // compute: blue
    case OpProperty::copy_to_device: return 0xFF55A868;    // host to device: green
    case OpProperty::copy_from_device: return 0xFFDD8452;  // device to host: orange
    case OpProperty::copy_peer: return 0xFF8172B3;         // peer: purple
    case OpProperty::prioritized: return 0xFFC44E52;       // red
  }
  return 0xFF999999;
}

class NvtxDomains {
 public:
  NvtxDomains() : push_(nvtxDomainCreateA("weft push")) {}
  ~NvtxDomains() {
    for (auto* list : {&cpu_, &gpu_})
      for (nvtxDomainHandle_t d : *list) nvtxDomainDestroy(d);
    nvtxDomainDestroy(push_);
  }
  NvtxDomains(const NvtxDomains&) = delete;
  NvtxDomains& operator=(const NvtxDomains&) = delete;

  // Called while the engine is built (not thread-safe); devices of a kind in
  // index order.
  void add(Device device) {
    (device.is_gpu() ? gpu_ : cpu_).push_back(nvtxDomainCreateA(("weft " + device.str()).c_str()));
  }
  nvtxDomainHandle_t push() const noexcept { return push_; }
  // Per op: an index, not a lookup.
  nvtxDomainHandle_t of(Device device) const noexcept {
    const auto& list = device.is_gpu() ? gpu_ : cpu_;
    const auto i = static_cast<std::size_t>(device.index());
    return i < list.size() ? list[i] : push_;
  }

 private:
  nvtxDomainHandle_t push_;
  std::vector<nvtxDomainHandle_t> cpu_, gpu_;
};

class NvtxRange {
 public:
  NvtxRange(nvtxDomainHandle_t domain, const char* name, OpProperty property) noexcept : domain_(domain) {
    nvtxEventAttributes_t a{};
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.colorType = NVTX_COLOR_ARGB;
    a.color = nvtx_colour(property);
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = (name && *name) ? name : "(unnamed)";
    nvtxDomainRangePushEx(domain_, &a);
  }
  ~NvtxRange() { nvtxDomainRangePop(domain_); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  nvtxDomainHandle_t domain_;
};

#else  // no NVTX: same interface, no code

class NvtxDomains {
 public:
  void add(Device) {}
  void* push() const noexcept { return nullptr; }
  void* of(Device) const noexcept { return nullptr; }
};

class NvtxRange {
 public:
  NvtxRange(void*, const char*, OpProperty) noexcept {}
};

#endif

}  // namespace weft::detail
