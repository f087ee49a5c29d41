// In-process collectives on CPU members (the shape every in-process
// collective shares: local_phase.h; GPU members: local_gpu_collectives.cpp).
#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "collectives/call.h"
#include "collectives/elements.h"
#include "collectives/local_phase.h"
#include "collectives/communicator_state.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor_op.h"

namespace weft::parallel {
namespace {

// ---- element loops of the data phase -------------------------------------------

void reduce_into(float* dst, const float* src, std::int64_t n, ReduceOp op) {
  if (op == ReduceOp::max) {
    for (std::int64_t i = 0; i < n; ++i) dst[i] = std::max(dst[i], src[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) dst[i] += src[i];
  }
}

void copy_floats(float* dst, const float* src, std::int64_t n) {
  if (n > 0) std::memcpy(dst, src, static_cast<std::size_t>(n) * sizeof(float));
}

void finish_average(float* p, std::int64_t n, ReduceOp op, int members) {
  if (op != ReduceOp::average || members == 1) return;
  const float scale = 1.0f / static_cast<float>(members);
  for (std::int64_t i = 0; i < n; ++i) p[i] *= scale;
}

// Any dtype: `dst` (n elements) becomes the reduction of `sources` (n
// elements each, in order), summed in float32 and stored once; in float32
// bit-identical to reduce_into over the sources in turn.
template <class E>
void reduce_sources(typename E::T* dst, const std::vector<const typename E::T*>& sources, std::int64_t n, ReduceOp op,
                    int members) {
  using T = typename E::T;
  const float scale = op == ReduceOp::average && members > 1 ? 1.0f / static_cast<float>(members) : 1.0f;
  for (std::int64_t i = 0; i < n; ++i) {
    float acc = E::load(sources[0][i]);
    for (std::size_t m = 1; m < sources.size(); ++m) {
      const float x = E::load(static_cast<const T*>(sources[m])[i]);
      acc = op == ReduceOp::max ? std::max(acc, x) : acc + x;
    }
    if (scale != 1.0f) acc *= scale;
    dst[i] = E::store(acc);
  }
}

using detail::all_but;
using detail::Phase;
using detail::PhaseVars;

// On CPU members the hold op and the last op run on the first member's device.
void push_hold(const detail::Call& call, const std::vector<Tensor>& reads, const std::vector<Tensor>& writes,
               detail::PhaseStart start) {
  detail::push_hold(call, call.state().devices.front(), reads, writes, std::move(start));
}
void push_done(Engine& e, const std::shared_ptr<Phase>& phase, const std::shared_ptr<PhaseVars>& vars, Device where,
               int priority) {
  detail::push_done(e, phase, {vars}, where, priority);
}

class LocalTransport final : public detail::Transport {
 public:
  bool records_flight() const override { return true; }
  explicit LocalTransport(const detail::CommunicatorState& state) : devices_(state.devices) {}
  std::string str() const override {
    const std::size_t n = devices_.size();
    std::string s = "in-process communicator of " + std::to_string(n) + " member" + (n == 1 ? "" : "s") + ":";
    for (std::size_t i = 0; i < n; ++i) s += (i ? ", " : " ") + devices_[i].str();
    return s;
  }
  void allreduce(const detail::Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override;
  // The ring of bfloat16 or float16 tensors.
  void allreduce_half(const detail::Call& call, const std::vector<Tensor>& tensors, ReduceOp op);
  void broadcast(const detail::Call& call, const std::vector<Tensor>& tensors) override;
  void reduce(const detail::Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override;
  void reduce_scatter(const detail::Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override;
  void all_gather(const detail::Call& call, const std::vector<Tensor>& inputs,
                  const std::vector<Tensor>& outputs) override;
  bool all_gather_in_place() const override { return true; }
  void barrier(const detail::Call& call) override;
  void send(detail::Call& call, const Tensor& tensor, int from, int to) override;
  void recv(detail::Call& call, const Tensor& tensor, int from, int to) override;

 private:
  std::vector<Device> devices_;  // member r's device
  detail::Mailboxes mailboxes_;  // send and recv
};

// ---- allreduce: a chunked ring -------------------------------------------------

void LocalTransport::allreduce(const detail::Call& call, const std::vector<Tensor>& tensors, ReduceOp op) {
  const int n = static_cast<int>(devices_.size());
  const std::int64_t count = tensors[0].numel();
  if (is_half(tensors[0].dtype())) return allreduce_half(call, tensors, op);
  // Read and written in place: a failed input fails the collective.
  push_hold(call, tensors, tensors,
            [n, count, op, devices = devices_, priority = call.options().priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    auto vars = std::make_shared<PhaseVars>(e, phase->what, n, n);
    auto name = [&](const char* step, int s, int c) {
      return phase->what + " " + step + " " + std::to_string(s) + " chunk " + std::to_string(c);
    };
    // Reduce-scatter: in step s, member i adds its chunk (i - s) into member
    // i + 1's; after n - 1 steps member i holds the reduction of chunk i + 1.
    // Each step is an op on the receiving member's device.
    for (int s = 0; s + 1 < n; ++s)
      for (int i = 0; i < n; ++i) {
        const int dst = (i + 1) % n, c = ((i - s) % n + n) % n;
        const Chunk k = chunk(count, n, c);
        const bool last = s + 2 == n;
        e.push(
            [phase, vars, i, dst, k, op, last, n] {
              float* d = phase->out_f(dst) + k.begin;
              reduce_into(d, phase->out_f(i) + k.begin, k.size(), op);
              if (last) finish_average(d, k.size(), op, n);
            },
            devices[static_cast<std::size_t>(dst)], vars->at(i, c), vars->at(dst, c),
            {.priority = priority, .name = name("reduce-scatter step", s, c)});
      }
    // All-gather: in step s, member i copies its reduced chunk (i + 1 - s)
    // to member i + 1.
    for (int s = 0; s + 1 < n; ++s)
      for (int i = 0; i < n; ++i) {
        const int dst = (i + 1) % n, c = ((i + 1 - s) % n + n) % n;
        const Chunk k = chunk(count, n, c);
        e.push([phase, vars, i, dst, k] { copy_floats(phase->out_f(dst) + k.begin, phase->out_f(i) + k.begin, k.size()); },
               devices[static_cast<std::size_t>(dst)], vars->at(i, c), vars->at(dst, c),
               {.priority = priority, .name = name("all-gather step", s, c)});
      }
    push_done(e, phase, vars, devices[0], priority);
  });
}

// The same ring on bfloat16 or float16 tensors: partial sums travel in
// float32 buffers (one per member), and each reduced chunk is rounded once,
// into its owner's tensor, at the last reduce-scatter step; the all-gather
// then copies half-precision chunks. So every member ends with the float32
// ring's result (the same sums in the same order) rounded once.
void LocalTransport::allreduce_half(const detail::Call& call, const std::vector<Tensor>& tensors, ReduceOp op) {
  const int n = static_cast<int>(devices_.size());
  const std::int64_t count = tensors[0].numel();
  const DType dtype = tensors[0].dtype();
  const std::size_t element = dtype_size(dtype);
  push_hold(call, tensors, tensors,
            [n, count, op, dtype, element, devices = devices_, priority = call.options().priority](
                Engine& e, const std::shared_ptr<Phase>& phase) {
    auto vars = std::make_shared<PhaseVars>(e, phase->what, n, n);
    auto partial = std::make_shared<std::vector<std::unique_ptr<float[]>>>();
    if (n > 1)
      for (int r = 0; r < n; ++r) partial->push_back(std::make_unique_for_overwrite<float[]>(static_cast<std::size_t>(count)));
    auto name = [&](const char* step, int s, int c) {
      return phase->what + " " + step + " " + std::to_string(s) + " chunk " + std::to_string(c);
    };
    // Reduce-scatter: in step s, member i's chunk (i - s) — its own tensor's
    // at s = 0, its partial sum after — is added to member i + 1's own
    // chunk into member i + 1's partial sum.
    for (int s = 0; s + 1 < n; ++s)
      for (int i = 0; i < n; ++i) {
        const int dst = (i + 1) % n, c = ((i - s) % n + n) % n;
        const Chunk k = chunk(count, n, c);
        const bool first = s == 0, last = s + 2 == n;
        e.push(
            [phase, partial, i, dst, k, op, first, last, n, dtype] {
              detail::with_elements(dtype, [&](auto el) {
                using E = decltype(el);
                using T = typename E::T;
                const T* mine = static_cast<const T*>(phase->out_at(dst)) + k.begin;
                const T* theirs = static_cast<const T*>(phase->out_at(i)) + k.begin;
                const float* sum = (*partial)[static_cast<std::size_t>(i)].get() + k.begin;
                float* d = (*partial)[static_cast<std::size_t>(dst)].get() + k.begin;
                for (std::int64_t j = 0; j < k.size(); ++j) {
                  const float x = first ? E::load(theirs[j]) : sum[j];
                  d[j] = op == ReduceOp::max ? std::max(E::load(mine[j]), x) : E::load(mine[j]) + x;
                }
                if (!last) return;
                finish_average(d, k.size(), op, n);
                T* out = static_cast<T*>(phase->out_at(dst)) + k.begin;
                for (std::int64_t j = 0; j < k.size(); ++j) out[j] = E::store(d[j]);
              });
            },
            devices[static_cast<std::size_t>(dst)], vars->at(i, c), vars->at(dst, c),
            {.priority = priority, .name = name("reduce-scatter step", s, c)});
      }
    // All-gather: as in float32, the rounded chunks.
    for (int s = 0; s + 1 < n; ++s)
      for (int i = 0; i < n; ++i) {
        const int dst = (i + 1) % n, c = ((i + 1 - s) % n + n) % n;
        const Chunk k = chunk(count, n, c);
        e.push(
            [phase, i, dst, k, element] {
              if (k.size() > 0)
                std::memcpy(static_cast<unsigned char*>(phase->out_at(dst)) + static_cast<std::size_t>(k.begin) * element,
                            static_cast<const unsigned char*>(phase->out_at(i)) + static_cast<std::size_t>(k.begin) * element,
                            static_cast<std::size_t>(k.size()) * element);
            },
            devices[static_cast<std::size_t>(dst)], vars->at(i, c), vars->at(dst, c),
            {.priority = priority, .name = name("all-gather step", s, c)});
      }
    push_done(e, phase, vars, devices[0], priority);
  });
}

// ---- broadcast and reduce: direct, through shared memory ------------------------

void LocalTransport::broadcast(const detail::Call& call, const std::vector<Tensor>& tensors) {
  const int n = static_cast<int>(devices_.size()), root = call.options().root;
  const std::size_t bytes = tensors[0].nbytes();
  // The root's tensor is read, the others written.
  push_hold(call, {tensors[static_cast<std::size_t>(root)]}, all_but(tensors, root),
            [n, root, bytes, devices = devices_, priority = call.options().priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    auto vars = std::make_shared<PhaseVars>(e, phase->what, n, 1);
    for (int r = 0, k = 0; r < n; ++r) {
      if (r == root) continue;
      const int slot = k++;
      e.push(
          [phase, vars, slot, bytes] {
            if (bytes > 0) std::memcpy(phase->out[static_cast<std::size_t>(slot)], phase->in[0], bytes);
          },
          devices[static_cast<std::size_t>(r)], {}, vars->at(r, 0),
          {.priority = priority, .name = phase->what + " to member " + std::to_string(r)});
    }
    push_done(e, phase, vars, devices[0], priority);
  });
}

void LocalTransport::reduce(const detail::Call& call, const std::vector<Tensor>& tensors, ReduceOp op) {
  const int n = static_cast<int>(devices_.size()), root = call.options().root;
  const std::int64_t count = tensors[0].numel();
  // Read: the others in member order, then the root (reduced in place).
  std::vector<Tensor> reads = all_but(tensors, root);
  reads.push_back(tensors[static_cast<std::size_t>(root)]);
  push_hold(call, reads, {tensors[static_cast<std::size_t>(root)]},
            [n, count, op, devices = devices_, root, dtype = tensors[0].dtype(), priority = call.options().priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    // The root reduces chunk c of every member into its own: one op per
    // chunk, so that the root's workers share the work.
    auto vars = std::make_shared<PhaseVars>(e, phase->what, 1, n);
    for (int c = 0; c < n; ++c) {
      const Chunk k = chunk(count, n, c);
      e.push(
          [phase, k, op, n, dtype] {
            detail::with_elements(dtype, [&](auto el) {
              using T = typename decltype(el)::T;
              T* d = static_cast<T*>(phase->out_at(0)) + k.begin;
              std::vector<const T*> sources{d};
              for (int m = 0; m + 1 < n; ++m) sources.push_back(static_cast<const T*>(phase->in_at(m)) + k.begin);
              reduce_sources<decltype(el)>(d, sources, k.size(), op, n);
            });
          },
          devices[static_cast<std::size_t>(root)], {}, vars->at(0, c),
          {.priority = priority, .name = phase->what + " chunk " + std::to_string(c)});
    }
    push_done(e, phase, vars, devices[0], priority);
  });
}

// ---- reduce-scatter and all-gather: each member works on its own chunk --------

void LocalTransport::reduce_scatter(const detail::Call& call, const std::vector<Tensor>& inputs,
                                    const std::vector<Tensor>& outputs, ReduceOp op) {
  const int n = static_cast<int>(devices_.size());
  const std::int64_t count = inputs[0].numel();
  push_hold(call, inputs, outputs,
            [n, count, op, devices = devices_, dtype = inputs[0].dtype(), priority = call.options().priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    auto vars = std::make_shared<PhaseVars>(e, phase->what, n, 1);
    for (int r = 0; r < n; ++r) {
      const Chunk k = chunk(count, n, r);
      e.push(
          [phase, r, k, op, n, dtype] {
            detail::with_elements(dtype, [&](auto el) {
              using T = typename decltype(el)::T;
              std::vector<const T*> sources;
              for (int m = 0; m < n; ++m) sources.push_back(static_cast<const T*>(phase->in_at(m)) + k.begin);
              reduce_sources<decltype(el)>(static_cast<T*>(phase->out_at(r)), sources, k.size(), op, n);
            });
          },
          devices[static_cast<std::size_t>(r)], {}, vars->at(r, 0),
          {.priority = priority, .name = phase->what + " on member " + std::to_string(r)});
    }
    push_done(e, phase, vars, devices[0], priority);
  });
}

void LocalTransport::all_gather(const detail::Call& call, const std::vector<Tensor>& inputs,
                                const std::vector<Tensor>& outputs) {
  const int n = static_cast<int>(devices_.size());
  const std::int64_t count = outputs[0].numel();
  const std::size_t element = dtype_size(outputs[0].dtype());
  push_hold(call, inputs, outputs,
            [n, count, element, devices = devices_, priority = call.options().priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    auto vars = std::make_shared<PhaseVars>(e, phase->what, n, 1);
    for (int r = 0; r < n; ++r)
      e.push(
          [phase, r, n, count, element] {
            auto* d = static_cast<unsigned char*>(phase->out[static_cast<std::size_t>(r)]);
            for (int m = 0; m < n; ++m) {
              const Chunk k = chunk(count, n, m);
              unsigned char* to = d + static_cast<std::size_t>(k.begin) * element;
              const void* from = phase->in[static_cast<std::size_t>(m)];
              if (k.size() > 0 && to != from)  // in place: a member's own chunk is there already
                std::memcpy(to, from, static_cast<std::size_t>(k.size()) * element);
            }
          },
          devices[static_cast<std::size_t>(r)], {}, vars->at(r, 0),
          {.priority = priority, .name = phase->what + " on member " + std::to_string(r)});
    push_done(e, phase, vars, devices[0], priority);
  });
}

// ---- barrier ---------------------------------------------------------------------

void LocalTransport::barrier(const detail::Call& call) {
  // Every member is driven by this process, which reached the call: there
  // is nobody to wait for. One op marks the point in traces.
  call.state().engine->push(
      [flight = call.flight()] {
        detail::flight_started(flight);
        detail::flight_completed(flight, nullptr);
      },
      devices_.front(), {}, {},
                            {.priority = call.options().priority, .name = call.label()});
}

// ---- send and recv: a snapshot handed over in push order --------------------------

void copy_bytes(RunContext&, const TensorData& d, std::size_t bytes) {
  if (bytes > 0) std::memcpy(d.outputs[0], d.inputs[0], bytes);
}

void LocalTransport::send(detail::Call& call, const Tensor& tensor, int from, int to) {
  // The snapshot is taken by an op pushed now: the sender may overwrite its
  // tensor right after, and the recv copies what it held at the send.
  mailboxes_.post(call, from, to, [&] {
    Tensor snapshot = Tensor::empty(tensor.engine(), tensor.shape(), tensor.device(), tensor.dtype());
    push_tensor_op(tensor.device(), {tensor}, {snapshot},
                   [bytes = tensor.nbytes(), flight = call.flight()](RunContext& ctx, const TensorData& d) {
                     detail::flight_started(flight);
                     copy_bytes(ctx, d, bytes);
                     detail::flight_completed(flight, nullptr);
                   },
                   {.priority = call.options().priority, .name = call.label()});
    return snapshot;
  });
}

void LocalTransport::recv(detail::Call& call, const Tensor& tensor, int from, int to) {
  Tensor snapshot = mailboxes_.take(call, tensor, from, to);
  push_tensor_op(tensor.device(), {snapshot}, {tensor},
                 [bytes = tensor.nbytes(), flight = call.flight()](RunContext& ctx, const TensorData& d) {
                   detail::flight_started(flight);
                   copy_bytes(ctx, d, bytes);
                   detail::flight_completed(flight, nullptr);
                 },
                 {.priority = call.options().priority, .name = call.label()});
}

}  // namespace

std::unique_ptr<detail::Transport> detail::make_local_transport(CommunicatorState& state) {
  if (state.devices.front().is_gpu()) {
    std::unique_ptr<Transport> ring = make_local_gpu_transport(state);
#if WEFT_HAVE_NCCL
    if (nccl_wanted()) return make_nccl_transport(state, std::move(ring));
#endif
    return ring;
  }
  return std::make_unique<LocalTransport>(state);
}

}  // namespace weft::parallel
