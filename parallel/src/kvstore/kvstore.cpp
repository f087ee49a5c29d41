// KVStore: the key table and placement on the calling thread; every sum,
// copy and update an engine op (ops/ and the collectives), so the engine
// orders each key's pushes and pulls with everything else on its tensors.
#include "weft/parallel/kvstore.h"

#include <algorithm>
#include <mutex>
#include <numeric>
#include <utility>

#include "weft/error.h"
#include "weft/nn_ops.h"
#include "weft/ops.h"

namespace weft::parallel {

std::string_view to_string(KVStoreKind kind) noexcept {
  switch (kind) {
    case KVStoreKind::local: return "local";
    case KVStoreKind::device: return "device";
    case KVStoreKind::dist_sync: return "dist_sync";
  }
  return "?";
}

KVStoreKind parse_kvstore_kind(std::string_view text) {
  for (KVStoreKind k : {KVStoreKind::local, KVStoreKind::device, KVStoreKind::dist_sync})
    if (text == to_string(k)) return k;
  throw InvalidArgument("unknown KVStore kind '" + std::string(text) + "' (kinds: local, device, dist_sync)");
}

std::string Key::str() const { return is_name() ? "key '" + text() + "'" : "key " + text(); }

std::string Key::text() const {
  if (const auto* name = std::get_if<std::string>(&key_)) return *name;
  return std::to_string(std::get<std::int64_t>(key_));
}

Updater sgd_updater(float lr, float weight_decay) {
  return [lr, weight_decay](const Key&, const Tensor& merged, Tensor& stored) {
    ops::sgd_update(stored, merged, lr, weight_decay);
  };
}

namespace {

struct Entry {
  Shape shape;
  Device device;
  Tensor value;                 // the stored value
  Tensor merge;                 // the sum of a push
  std::vector<Tensor> staging;  // value i of a push, copied to `device` (i >= 1)
};

}  // namespace

struct KVStore::State {
  Engine* engine = nullptr;
  KVStoreKind kind = KVStoreKind::local;
  Device host;
  std::vector<Device> devices;          // where values may live
  std::optional<Communicator> across;   // dist_sync
  // Guards everything below, and keeps a push's ops (sum, then update)
  // together against another thread's push of the key. Recursive: the
  // updater runs under it and may call the store.
  mutable std::recursive_mutex mutex;
  Updater updater;
  std::map<Key, Entry> entries;
  std::map<Device, std::int64_t> load;  // bytes placed per device

  std::string label() const { return std::string(to_string(kind)) + " KVStore"; }

  Entry& entry(const Key& key, const char* call) {
    auto it = entries.find(key);
    if (it == entries.end())
      throw InvalidArgument(label() + ": " + call + " of " + key.str() +
                            ", which was never initialized (init it first)");
    return it->second;
  }

  void check_tensor(const Key& key, const Entry& e, const Tensor& t, const char* call, const char* what,
                    std::size_t index) const {
    const std::string where = label() + ": " + call + " of " + key.str() + ": " + what + " " + std::to_string(index);
    if (!t.defined()) throw InvalidArgument(where + " is an undefined tensor");
    if (t.dtype() != DType::float32)
      throw InvalidArgument(where + " is " + std::string(weft::to_string(t.dtype())) + "; the store holds float32");
    if (t.shape() != e.shape)
      throw InvalidArgument(where + " has shape " + t.shape().str() + "; the key was initialized with " +
                            e.shape.str());
    if (&t.engine() != engine) throw InvalidArgument(where + " belongs to another engine");
  }

  Device place(std::int64_t bytes) {
    if (kind != KVStoreKind::device) return host;
    // The least loaded so far; ties go to the first in the device list.
    Device best = devices.front();
    for (const Device& d : devices)
      if (load[d] < load[best]) best = d;
    load[best] += bytes;
    return best;
  }
};

KVStore::KVStore(Engine& engine, KVStoreKind kind, KVStoreOptions options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.engine = &engine;
  s.kind = kind;
  s.host = options.host.value_or(Device::cpu(0));
  const std::vector<Device> have = engine.devices();
  auto check = [&](const Device& d, const char* what) {
    if (std::find(have.begin(), have.end(), d) == have.end())
      throw InvalidArgument(s.label() + ": " + what + " " + d.str() + " is not a device of this engine");
  };
  check(s.host, "host");
  if (kind == KVStoreKind::device) {
    s.devices = std::move(options.devices);
    if (s.devices.empty()) {
      for (const Device& d : have)
        if (d.is_gpu()) s.devices.push_back(d);
      if (s.devices.empty())
        for (const Device& d : have)
          if (d.is_cpu()) s.devices.push_back(d);
    }
    for (const Device& d : s.devices) check(d, "device");
  } else if (!options.devices.empty()) {
    throw InvalidArgument(s.label() + ": devices are for the device kind; " + std::string(to_string(kind)) +
                          " stores live on the host (KVStoreOptions::host)");
  }
  if (kind == KVStoreKind::dist_sync) s.across = Communicator::mpi(engine, s.host, options.communicator);
}

KVStore::~KVStore() = default;
KVStore::KVStore(KVStore&&) noexcept = default;
KVStore& KVStore::operator=(KVStore&&) noexcept = default;

void KVStore::init(const Key& key, const Tensor& value) { init(std::vector<Key>{key}, std::vector<Tensor>{value}); }

void KVStore::init(const std::vector<Key>& keys, const std::vector<Tensor>& values) {
  State& s = *state_;
  if (keys.size() != values.size())
    throw InvalidArgument(s.label() + ": init of " + std::to_string(keys.size()) + " keys with " +
                          std::to_string(values.size()) + " values");
  std::lock_guard lock(s.mutex);
  for (std::size_t i = 0; i < keys.size(); ++i) {
    if (s.entries.count(keys[i]))
      throw InvalidArgument(s.label() + ": init of " + keys[i].str() + ", which is initialized already");
    for (std::size_t j = 0; j < i; ++j)
      if (keys[j] == keys[i]) throw InvalidArgument(s.label() + ": init lists " + keys[i].str() + " twice");
    Entry probe{values[i].defined() ? values[i].shape() : Shape{}, s.host, {}, {}, {}};
    s.check_tensor(keys[i], probe, values[i], "init", "value", i);
  }
  // Largest first, so that greedy placement balances bytes (stable: equal
  // sizes keep the caller's order, the same on every process).
  std::vector<std::size_t> order(keys.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return values[a].numel() > values[b].numel(); });
  for (std::size_t i : order) {
    const Tensor& v = values[i];
    Entry e;
    e.shape = v.shape();
    e.device = s.place(static_cast<std::int64_t>(v.nbytes()));
    e.value = Tensor::empty(*s.engine, e.shape, e.device);
    e.value.set_name("kvstore " + keys[i].text());
    e.value.copy_from(v);
    e.merge = Tensor::empty(*s.engine, e.shape, e.device);
    e.merge.set_name("kvstore merge " + keys[i].text());
    s.entries.emplace(keys[i], std::move(e));
  }
}

void KVStore::push(const Key& key, const std::vector<Tensor>& values) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  Entry* e = &s.entry(key, "push");
  {
    if (values.empty()) throw InvalidArgument(s.label() + ": push of " + key.str() + " with no values");
    for (std::size_t i = 0; i < values.size(); ++i) s.check_tensor(key, *e, values[i], "push", "value", i);
    // Sum on the key's device: the first value copied in, the others added
    // (those on other devices copied over first, each through its own
    // buffer, so the copies run at once).
    e->merge.copy_from(values[0]);
    if (e->staging.size() < values.size()) e->staging.resize(values.size());
    for (std::size_t i = 1; i < values.size(); ++i) {
      if (values[i].device() == e->device) {
        ops::axpy(1.0f, values[i], e->merge);
        continue;
      }
      Tensor& staged = e->staging[i];
      if (!staged.defined()) staged = Tensor::empty(*s.engine, e->shape, e->device);
      staged.copy_from(values[i]);
      ops::axpy(1.0f, staged, e->merge);
    }
    if (s.across) allreduce(*s.across, {e->merge}, ReduceOp::sum, {.name = "kvstore push " + key.text()});
  }
  if (s.updater) {
    const Updater updater = s.updater;  // the updater may replace itself
    updater(key, e->merge, e->value);
  } else {
    e->value.copy_from(e->merge);
  }
}

void KVStore::pull(const Key& key, const std::vector<Tensor>& outs) {
  State& s = *state_;
  std::lock_guard lock(s.mutex);
  Entry& e = s.entry(key, "pull");
  for (std::size_t i = 0; i < outs.size(); ++i) s.check_tensor(key, e, outs[i], "pull", "out", i);
  for (Tensor out : outs) out.copy_from(e.value);  // a handle: writes the caller's storage
}

void KVStore::pushpull(const Key& key, const std::vector<Tensor>& values, const std::vector<Tensor>& outs) {
  push(key, values);
  pull(key, outs);
}

void KVStore::set_updater(Updater updater) {
  std::lock_guard lock(state_->mutex);
  state_->updater = std::move(updater);
}

KVStoreKind KVStore::kind() const noexcept { return state_->kind; }

Device KVStore::placement(const Key& key) const {
  std::lock_guard lock(state_->mutex);
  return state_->entry(key, "placement").device;
}

bool KVStore::contains(const Key& key) const {
  std::lock_guard lock(state_->mutex);
  return state_->entries.count(key) != 0;
}

std::vector<Key> KVStore::keys() const {
  std::lock_guard lock(state_->mutex);
  std::vector<Key> out;
  for (const auto& [k, e] : state_->entries) out.push_back(k);
  return out;
}

int KVStore::rank() const noexcept { return state_->across ? state_->across->local_ranks()[0] : 0; }
int KVStore::num_workers() const noexcept { return state_->across ? state_->across->size() : 1; }

std::string KVStore::str() const {
  const State& s = *state_;
  std::lock_guard lock(s.mutex);
  std::string out = s.label() + " on ";
  if (s.kind == KVStoreKind::device) {
    for (std::size_t i = 0; i < s.devices.size(); ++i) out += (i ? ", " : "") + s.devices[i].str();
  } else {
    out += s.host.str();
  }
  if (s.across) out += " across " + std::to_string(s.across->size()) + " processes";
  return out + ": " + std::to_string(s.entries.size()) + (s.entries.size() == 1 ? " key" : " keys");
}

}  // namespace weft::parallel
