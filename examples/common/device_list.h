// Device lists on the command line ("cpu:0,cpu:1", "gpu:0,gpu:1", mixes):
// the --devices flags of the trainer and the benchmarks.
#pragma once

#include <string>
#include <vector>

#include "arg_cursor.h"
#include "weft/device.h"

namespace weft::examples {

// "cpu:0,gpu:1" -> devices (each as Device::parse reads it); throws
// weft::Error naming a bad one.
inline std::vector<Device> parse_device_list(const std::string& text) {
  std::vector<Device> out;
  for (const std::string& item : ArgCursor::split_list(text)) out.push_back(Device::parse(item));
  return out;
}

// devices -> "cpu(0),gpu(1)".
inline std::string device_list_str(const std::vector<Device>& devices) {
  std::string out;
  for (Device d : devices) {
    if (!out.empty()) out += ',';
    out += d.str();
  }
  return out;
}

}  // namespace weft::examples
