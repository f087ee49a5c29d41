// weft::parallel::KVStore — parameter-server semantics on engine ops.
//
// A store of named tensors. push(key, values) sums values from any number of
// devices and merges the sum into the stored value through the updater
// (assignment by default, or an optimizer step such as sgd_updater);
// pull(key, outs) copies the stored value to each out; pushpull does both.
// Every call pushes engine ops and returns at once, ordered with every other
// op on the key's tensors: "pull after push sees it" needs no wait, and
// pushes to different keys run concurrently. Values are float32. A shape or
// dtype other than init's, a key used before init or initialized twice, and
// an empty value list are weft::InvalidArgument naming the key (key 3, key
// 'fc1.weight'), at the call. Calls from several threads are safe. Where
// each kind sums and keeps its values: docs/design/kvstore.md.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"

namespace weft::parallel {

enum class KVStoreKind : std::uint8_t {
  local,      // values live on the host device (cpu(0) by default) and are summed there
  device,     // each key lives on one of the store's devices (placed at init) and is summed there
  // Across the processes of an MPI job, every process holding the same value.
  // Every process creates its stores and calls init and push in the same
  // order (pull is local); a process that pushes another key or shape fails
  // every rank with an error naming both sides instead of hanging.
  dist_sync,
};
std::string_view to_string(KVStoreKind kind) noexcept;
// "local", "device" or "dist_sync"; throws weft::InvalidArgument naming the
// text and the kinds otherwise.
KVStoreKind parse_kvstore_kind(std::string_view text);

// An integer key or a name. Ordered (integers first), so keys sort the same
// on every process.
class Key {
 public:
  Key(std::int64_t id) : key_(id) {}  // NOLINT(google-explicit-constructor): keys read as literals
  Key(int id) : key_(std::int64_t{id}) {}  // NOLINT(google-explicit-constructor)
  Key(std::string name) : key_(std::move(name)) {}  // NOLINT(google-explicit-constructor)
  Key(const char* name) : key_(std::string(name)) {}  // NOLINT(google-explicit-constructor)
  bool is_name() const noexcept { return std::holds_alternative<std::string>(key_); }
  // "key 3" or "key 'fc1.weight'"
  std::string str() const;
  // "3" or "fc1.weight"
  std::string text() const;
  auto operator<=>(const Key&) const = default;

 private:
  std::variant<std::int64_t, std::string> key_;
};

// Merges a push's sum into the stored value by pushing ops. It runs on the
// thread calling push, once per push, under the store's lock (it may call
// the store); the ops it pushes run where `stored` lives. `merged` is the
// sum of the pushed values (across processes for dist_sync), on stored's
// device; it is the store's buffer, reused by the key's next push: read it
// only in ops pushed now.
using Updater = std::function<void(const Key& key, const Tensor& merged, Tensor& stored)>;

// stored -= lr * (merged + weight_decay * stored) (ops::sgd_update).
Updater sgd_updater(float lr, float weight_decay = 0.0f);

struct KVStoreOptions {
  // local and dist_sync: where values live and sums happen (default cpu(0)).
  std::optional<Device> host;
  // device: where values may live (default: the engine's GPUs, else its CPU
  // devices).
  std::vector<Device> devices;
  // dist_sync: how long a push may wait for the other processes, and
  // whether it fingerprints (the communicator's options and defaults).
  CommunicatorOptions communicator;
};

class KVStore {
 public:
  // dist_sync creates an MPI communicator (a collective call: every process
  // creates its stores in the same order). Throws weft::InvalidArgument for
  // a device the engine lacks.
  KVStore(Engine& engine, KVStoreKind kind, KVStoreOptions options = {});
  ~KVStore();
  KVStore(KVStore&&) noexcept;
  KVStore& operator=(KVStore&&) noexcept;

  // The key's value becomes a copy of `value` (on the key's device). Throws
  // for a key already initialized.
  void init(const Key& key, const Tensor& value);
  // Several keys at once; on the device kind they are placed largest first.
  void init(const std::vector<Key>& keys, const std::vector<Tensor>& values);

  // Sums `values` (one or more, each the key's shape and dtype, on any
  // devices of the engine) and merges the sum through the updater.
  void push(const Key& key, const std::vector<Tensor>& values);
  // Every out (the key's shape and dtype, on any device) becomes the value.
  void pull(const Key& key, const std::vector<Tensor>& outs);
  // push, then pull into `outs` (which may be the pushed tensors: with the
  // default updater, an allreduce).
  void pushpull(const Key& key, const std::vector<Tensor>& values, const std::vector<Tensor>& outs);

  // Replaces the updater for later pushes (default: assignment).
  void set_updater(Updater updater);

  KVStoreKind kind() const noexcept;
  Device placement(const Key& key) const;  // where the key's value lives (throws for an unknown key)
  bool contains(const Key& key) const;
  std::vector<Key> keys() const;  // sorted
  // This process's rank and the number of processes (0 and 1 unless dist_sync).
  int rank() const noexcept;
  int num_workers() const noexcept;
  // "device KVStore on gpu(0), gpu(1): 3 keys"
  std::string str() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace weft::parallel
