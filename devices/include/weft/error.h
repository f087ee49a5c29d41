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
//   ├── DeviceError       a GPU backend or library call failed (CUDA, cuBLAS,
//   │                     cuDNN, or the simulator)
//   ├── OpError           an op was misused while it ran: which op, on which
//   │                     device (a Completion called twice or never, a wait
//   │                     from inside an op)
//   └── CommunicationError  a collective or a transfer between ranks failed or
//                         timed out (MPI, NCCL, Weft's own): which rank,
//                         which peer
//
// An exception a user op throws reaches the waiter as it was thrown (its own
// type, its own message), as with std::future: catch it by the type the op
// threw. Weft's own errors raised inside a running op name that op.
#pragma once

#include <cstddef>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>

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

class OpError : public Error {
 public:
  // `what` is the whole message (it names the op and the device).
  OpError(const std::string& what, const std::string& op_name, Device device)
      : Error(what), op_name_(std::make_shared<const std::string>(op_name)), device_(device) {}
  const std::string& op_name() const noexcept { return *op_name_; }  // as pushed (may be empty)
  Device device() const noexcept { return device_; }                 // where the op ran

 private:
  std::shared_ptr<const std::string> op_name_;  // shared: copying an exception must not throw
  Device device_;
};

class CommunicationError : public Error {
 public:
  static constexpr int kNoPeer = -1;
  // `what` is the whole message (it names the operation, the rank and the peer).
  CommunicationError(const std::string& what, int rank, int peer = kNoPeer)
      : Error(what), rank_(rank), peer_(peer) {}
  int rank() const noexcept { return rank_; }  // the rank that raised it
  int peer() const noexcept { return peer_; }  // the rank it was talking to; kNoPeer: all, or unknown

 private:
  int rank_;
  int peer_;
};

static_assert(std::is_nothrow_copy_constructible_v<OpError> && std::is_nothrow_copy_constructible_v<CommunicationError>,
              "exceptions are copied when thrown and rethrown: copying must not throw");

}  // namespace weft
