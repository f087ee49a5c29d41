// weft::Error and the few kinds of it users catch by type.
//
// Every error Weft itself raises is a weft::Error (bad input, misuse, failed
// resources); the subclasses below say which, so that a caller can, say,
// retry with a smaller batch on OutOfMemory. Exceptions thrown by user ops
// keep their own type: the engine stores and rethrows them as they were.
//
//   Error
//   ├── InvalidArgument   a bad value given to Weft (shape, device, setting)
//   ├── OutOfMemory       a device had no room: which device, how much was
//   │                     asked for, how much it had free
//   └── DeviceError       a GPU runtime or library call failed (CUDA, cuBLAS,
//                         cuDNN, NCCL, or the simulator)
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

#include "weft/device.h"

namespace weft {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class InvalidArgument : public Error {
 public:
  using Error::Error;
};

class OutOfMemory : public Error {
 public:
  // `what` is the whole message (it names the device and both sizes).
  OutOfMemory(const std::string& what, Device device, std::size_t requested, std::size_t free_bytes)
      : Error(what), device_(device), requested_(requested), free_(free_bytes) {}
  Device device() const noexcept { return device_; }
  std::size_t requested() const noexcept { return requested_; }  // bytes asked for
  std::size_t free_bytes() const noexcept { return free_; }      // bytes the device had free then

 private:
  Device device_;
  std::size_t requested_;
  std::size_t free_;
};

class DeviceError : public Error {
 public:
  using Error::Error;
};

}  // namespace weft
