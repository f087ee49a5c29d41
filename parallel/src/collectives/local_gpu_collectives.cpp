// In-process collectives on GPU members: the chunked ring and its siblings
// over device copies (local_phase.h has the shape they share).
//
// The hold op runs on cpu(0) and only holds the members' tensors (and the
// scratch buffers the phase receives chunks into); each step of the data
// phase is a GPU op on the member that receives: a peer copy on that GPU's
// copy worker (its own stream, so copies overlap with reductions of other
// chunks), then, for the reducing collectives, an accumulate kernel on its
// priority stream (kReduceProperty). Steps of different GPUs order themselves by stream waits on
// the phase's variables, never by host waits. The phase's last op, on the
// first member's GPU, records an event behind every step; a fiber of the
// poll thread (comm_thread.h) completes the hold op once that event is done,
// so no worker waits on the host while a collective runs. Nor before it: the
// hold op does not wait for the GPU work that produced its inputs
// (OpOptions::defer_gpu_waits); every step, and the last op, makes its
// stream wait for that work's events instead (OpOptions::after_gpu_work).
//
// This is the form for simulated GPUs and for real ones without NCCL; sums
// come out in the same order as on CPU members, so results are bit-identical
// to theirs. bfloat16 and float16 reductions run the float32 form on float32
// copies and round the results once (through_float32.h): the values of the
// CPU ring, which rounds once too.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "collectives/call.h"
#include "collectives/comm_thread.h"
#include "collectives/communicator_state.h"
#include "collectives/local_phase.h"
#include "collectives/through_float32.h"
#include "weft/error.h"
#include "weft/gpu_sim.h"
#include "weft/gpu_streams.h"
#include "weft/parallel/collectives.h"
#include "weft/profiler.h"
#include "weft/tensor_op.h"

namespace weft::parallel::detail {
namespace {

// Enqueues on the op's stream a copy from `src` (on GPU `from`) to `dst`
// (on the op's GPU). Under the simulator's modeled mode a collective's GPU
// tensors hold no values (the hold op marks them): the copy takes its
// modeled time and moves nothing.
void copy_in(RunContext& ctx, void* dst, const void* src, Device from, std::size_t bytes) {
  if (bytes == 0) return;
  gpu::ScopedUndefinedBytes undefined_bytes(gpu::kernels_modeled());
  if (from == ctx.device)
    gpu::memcpy_async(dst, src, bytes, gpu::CopyKind::device_to_device, ctx.gpu->stream);
  else
    gpu::memcpy_peer_async(dst, ctx.device.index(), src, from.index(), bytes, ctx.gpu->stream);
}

Accumulate accumulate_of(ReduceOp op) { return op == ReduceOp::max ? Accumulate::max : Accumulate::sum; }

void finish_average(RunContext& ctx, float* p, std::int64_t n, ReduceOp op, int members) {
  if (op == ReduceOp::average && members > 1) scale(ctx, p, 1.0f / static_cast<float>(members), n);
}

const Device kHoldDevice = Device::cpu(0);

// The reductions run on each GPU's priority stream, beside its compute
// streams, as a communication library's kernels on their own stream: a
// collective's adds neither wait behind the model's queued kernels nor
// hold them up (and under the simulator's modeled mode they take their
// time beside the compute stream's kernels; docs/design/simulated-gpus.md).
constexpr OpProperty kReduceProperty = OpProperty::prioritized;

// The hierarchical allreduce's pipeline: pieces of at least 64 MiB, at most
// 8 (each piece's steps pay their latencies and launches again, which
// smaller pieces would not earn back).
constexpr std::int64_t kHierarchyPieceBytes = std::int64_t{64} << 20;
constexpr std::int64_t kHierarchyPieces = 8;

// The hold op of a collective over GPU members, on cpu(0).
void push_gpu_hold(const Call& call, const std::vector<Tensor>& reads, const std::vector<Tensor>& writes,
                   PhaseStart start) {
  push_hold(call, kHoldDevice, reads, writes, std::move(start), /*gpu_members=*/true);
}

// The phase's last op, on `gpu`: it reads and writes every variable of the
// phase, so its stream waits for every step; its body records an event
// there and hands it to a poll fiber, which completes the hold op once the
// event is done (with a step's failure, if one failed: still only once the
// work enqueued before it has drained, since the tensors stay in use until
// then).
void push_gpu_done(Engine& e, const std::shared_ptr<Phase>& phase,
                   const std::vector<std::shared_ptr<PhaseVars>>& vars, Device gpu, int priority) {
  std::vector<Var> writes;
  for (const auto& v : vars) {
    std::vector<Var> all = v->all();
    writes.insert(writes.end(), all.begin(), all.end());
  }
  e.push(
      [phase, vars](RunContext& ctx) {
        gpu::EventRef event(gpu::Event::record(ctx.device.index(), ctx.gpu->stream));
        CommThread& thread = poll_thread();
        auto wait = [phase, event, failed = ctx.failed_input, &thread] {
          std::exception_ptr error = failed;
          try {
            if (thread.poll_until([&] { return event->done(); }, Clock::time_point::max()) ==
                    CommThread::Wait::stopping &&
                !error)
              error = std::make_exception_ptr(
                  CommunicationError(phase->what + ": the process is exiting", CommunicationError::kNoPeer));
          } catch (...) {
            if (!error) error = std::current_exception();  // the GPU work failed
          }
          phase->done(error);
        };
        if (!thread.spawn(wait)) {
          // Exiting: nothing polls any more; wait here.
          std::exception_ptr error = ctx.failed_input;
          try {
            event->host_wait();
          } catch (...) {
            if (!error) error = std::current_exception();
          }
          phase->done(error);
        }
      },
      gpu, writes, writes,
      // Also behind the inputs' producers: a phase without steps (one member)
      // must not complete before them.
      {.priority = priority,
       .name = phase->what + " done",
       .run_on_failed_input = true,
       .after_gpu_work = phase->gpu_waits});
}

// Pushes a step of the data phase on `gpu`, its stream ordered after the
// GPU work the collective's tensors wait for.
template <class Body>
void step(Engine& e, const std::shared_ptr<Phase>& phase, Device gpu, std::vector<Var> reads, std::vector<Var> writes,
          OpProperty property, int priority, std::string name, Body body) {
  e.push(std::move(body), gpu, std::move(reads), std::move(writes),
         {.priority = priority, .name = std::move(name), .property = property, .after_gpu_work = phase->gpu_waits});
}

template <class T>
T& at(std::vector<T>& v, int k) {
  return v[static_cast<std::size_t>(k)];
}
template <class T>
const T& at(const std::vector<T>& v, int k) {
  return v[static_cast<std::size_t>(k)];
}

class LocalGpuTransport final : public Transport {
 public:
  explicit LocalGpuTransport(const CommunicatorState& state) : devices_(state.devices) {}
  std::string str() const override {
    const std::size_t n = devices_.size();
    std::string s = "in-process communicator of " + std::to_string(n) + " GPU member" + (n == 1 ? "" : "s") + ":";
    for (std::size_t i = 0; i < n; ++i) s += (i ? ", " : " ") + devices_[i].str();
    return s;
  }
  void allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override;
  void broadcast(const Call& call, const std::vector<Tensor>& tensors) override;
  void reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) override;
  void reduce_scatter(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
                      ReduceOp op) override;
  void all_gather(const Call& call, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs) override;
  bool all_gather_in_place() const override { return true; }
  void barrier(const Call& call) override;
  void send(Call& call, const Tensor& tensor, int from, int to) override;
  void recv(Call& call, const Tensor& tensor, int from, int to) override;

 private:
  // A scratch buffer of `count` floats on member r's GPU, held by the hold op.
  Tensor scratch(const Call& call, int r, std::int64_t count) const {
    return Tensor::empty(*call.state().engine, Shape{count}, at(devices_, r), DType::float32)
        .set_role(MemoryRole::communication)
        .set_name(call.label() + " scratch on member " + std::to_string(r));
  }
  // The members by node when they span nodes of simulated GPUs (two or
  // more nodes, as many members on each, more than one) and the
  // hierarchical allreduce of `bytes` is predicted faster than the ring.
  std::vector<std::vector<int>> hierarchy(const Call& call, double bytes) const;
  void allreduce_hierarchical(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op,
                              std::vector<std::vector<int>> nodes);

  std::vector<Device> devices_;  // member r's GPU
  Mailboxes mailboxes_;  // send and recv
};


// ---- allreduce: the chunked ring over peer copies ----------------------------------

void LocalGpuTransport::allreduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) {
  if (is_half(tensors[0].dtype())) {
    const std::vector<Tensor> wide = widened(tensors);
    allreduce(call, wide, op);
    return narrow_into(tensors, wide, call.label(), call.options().priority);
  }
  const int n = static_cast<int>(devices_.size());
  const std::int64_t count = tensors[0].numel();
  const int priority = call.options().priority;
  if (std::vector<std::vector<int>> nodes = hierarchy(call, static_cast<double>(count) * sizeof(float)); !nodes.empty())
    return allreduce_hierarchical(call, tensors, op, std::move(nodes));
  // Member r's chunks arrive in scratch r at their own offsets.
  std::vector<Tensor> writes = tensors;
  if (n > 1)
    for (int r = 0; r < n; ++r) writes.push_back(scratch(call, r, count));
  push_gpu_hold(call, tensors, writes,
                [devices = devices_, n, count, op, priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    // v: member r's chunk c; s: scratch r's chunk c; order: member r's
    // copies (0) and adds (1) in step order (see below).
    auto v = std::make_shared<PhaseVars>(e, phase->what, n, n);
    auto s = std::make_shared<PhaseVars>(e, phase->what + " scratch", n, n);
    auto order = std::make_shared<PhaseVars>(e, phase->what + " order", n, 2);
    // A GPU's copies share its peer stream, and its adds its priority
    // stream, which run them in the order they were enqueued; the engine
    // enqueues an op when its inputs' producers were enqueued, so steps
    // whose producers are on other GPUs become ready in whatever order the
    // host gets to them, and a later step's copy, enqueued first, would hold
    // an earlier one (and the whole ring behind it) until its own input is
    // reduced, a step later. Each step also writes its GPU's order
    // variable, which keeps the enqueue order the step order.
    auto copy_order = [&](int r) { return order->at(r, 0); };
    auto add_order = [&](int r) { return order->at(r, 1); };
    auto name = [&](const char* what, int step, int c) {
      return phase->what + " " + what + " " + std::to_string(step) + " chunk " + std::to_string(c);
    };
    // Reduce-scatter: in step t, member i's chunk (i - t) is copied into
    // member i + 1's scratch and added to its chunk there; after n - 1
    // steps member i holds the reduction of chunk i + 1.
    for (int t = 0; t + 1 < n; ++t)
      for (int i = 0; i < n; ++i) {
        const int dst = (i + 1) % n, c = ((i - t) % n + n) % n;
        const Chunk k = chunk(count, n, c);
        const auto bytes = static_cast<std::size_t>(k.size()) * sizeof(float);
        const Device from = at(devices, i);
        step(e, phase, at(devices, dst), {v->at(i, c)}, {s->at(dst, c), copy_order(dst)}, OpProperty::copy_peer,
             priority, name("reduce-scatter copy", t, c),
             [phase, i, dst, n, k, bytes, from](RunContext& ctx) {
               copy_in(ctx, phase->out_f(n + dst) + k.begin, phase->out_f(i) + k.begin, from, bytes);
             });
        const bool last = t + 2 == n;
        step(e, phase, at(devices, dst), {s->at(dst, c)}, {v->at(dst, c), add_order(dst)}, kReduceProperty,
             priority, name("reduce-scatter add", t, c),
             [phase, dst, n, k, op, last](RunContext& ctx) {
               float* d = phase->out_f(dst) + k.begin;
               accumulate(ctx, d, phase->out_f(n + dst) + k.begin, k.size(), accumulate_of(op));
               if (last) finish_average(ctx, d, k.size(), op, n);
             });
      }
    // All-gather: in step t, member i's reduced chunk (i + 1 - t) is copied
    // to member i + 1.
    for (int t = 0; t + 1 < n; ++t)
      for (int i = 0; i < n; ++i) {
        const int dst = (i + 1) % n, c = ((i + 1 - t) % n + n) % n;
        const Chunk k = chunk(count, n, c);
        const auto bytes = static_cast<std::size_t>(k.size()) * sizeof(float);
        const Device from = at(devices, i);
        step(e, phase, at(devices, dst), {v->at(i, c)}, {v->at(dst, c), copy_order(dst)}, OpProperty::copy_peer,
             priority, name("all-gather copy", t, c),
             [phase, i, dst, k, bytes, from](RunContext& ctx) {
               copy_in(ctx, phase->out_f(dst) + k.begin, phase->out_f(i) + k.begin, from, bytes);
             });
      }
    push_gpu_done(e, phase, {v, s, order}, devices.front(), priority);
  });
}

// ---- allreduce across nodes: reduce-scatter in each node, allreduce per rail, all-gather ----

std::vector<std::vector<int>> LocalGpuTransport::hierarchy(const Call& call, double bytes) const {
  const gpu::SimTopology topo = gpu::sim_topology();
  if (topo.gpus_per_node <= 0) return {};  // real GPUs of one process: one node
  std::map<int, std::vector<int>> by_node;
  for (int r = 0; r < static_cast<int>(devices_.size()); ++r)
    by_node[topo.node_of(at(devices_, r).index())].push_back(r);
  const auto m = static_cast<int>(by_node.size());
  const auto g = static_cast<int>(by_node.begin()->second.size());
  if (m < 2 || g < 2) return {};
  std::vector<std::vector<int>> nodes;
  for (auto& [node, members] : by_node) {
    if (static_cast<int>(members.size()) != g) return {};  // uneven nodes: the ring
    nodes.push_back(std::move(members));
  }
  // The two schemes' link time: the ring's 2(n-1) steps of S/n each wait
  // for the slowest link (a NIC); the hierarchy's node phases cross NVLink
  // and its rail phase moves S/g per GPU over that GPU's own NIC.
  const int n = m * g;
  const double ring = 2.0 * (n - 1) / n * bytes / (topo.nic_gbps * 1e9) + 2.0 * (n - 1) * topo.nic_latency_us * 1e-6;
  const double tiered = 2.0 * (g - 1) / g * bytes / (topo.nvlink_gbps * 1e9) +
                        2.0 * (m - 1) / m * bytes / g / (topo.nic_gbps * 1e9) +
                        2.0 * (g - 1) * topo.nvlink_latency_us * 1e-6 + 2.0 * (m - 1) * topo.nic_latency_us * 1e-6;
  char text[256];
  std::snprintf(text, sizeof text, "%s over %d nodes x %d GPUs, %.0f bytes: ring %.3f ms, hierarchical %.3f ms",
                tiered < ring ? "hierarchical" : "ring", m, g, bytes, ring * 1e3, tiered * 1e3);
  Profiler::note("allreduce " + call.label(), text);
  if (tiered >= ring) return {};
  return nodes;
}

void LocalGpuTransport::allreduce_hierarchical(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op,
                                               std::vector<std::vector<int>> nodes) {
  const int n = static_cast<int>(devices_.size());
  const std::int64_t count = tensors[0].numel();
  const int priority = call.options().priority;
  std::vector<Tensor> writes = tensors;
  for (int r = 0; r < n; ++r) writes.push_back(scratch(call, r, count));
  push_gpu_hold(call, tensors, writes,
                [devices = devices_, nodes = std::move(nodes), n, count, op, priority](
                    Engine& e, const std::shared_ptr<Phase>& phase) {
    const int m = static_cast<int>(nodes.size()), g = static_cast<int>(nodes[0].size());
    // The tensor in P pieces, pipelined: piece p's rail phase runs while
    // piece p + 1 is reduced in the node. Each piece in g regions (the node
    // phases' chunks), a region in m parts (the rail phase's).
    const int pieces = static_cast<int>(std::clamp<std::int64_t>(
        count * static_cast<std::int64_t>(sizeof(float)) / kHierarchyPieceBytes, 1, kHierarchyPieces));
    auto region = [count, g, pieces](int p, int c) {
      const Chunk piece = chunk(count, pieces, p), k = chunk(piece.size(), g, c);
      return Chunk{piece.begin + k.begin, piece.begin + k.end};
    };
    auto part = [&](int p, int c, int j) {
      const Chunk r = region(p, c), k = chunk(r.size(), m, j);
      return Chunk{r.begin + k.begin, r.begin + k.end};
    };
    // Per member: one variable per (piece, region) for the node phases and
    // per (piece, part of its own region) for the rail phase; scratch alike.
    auto v = std::make_shared<PhaseVars>(e, phase->what, n, pieces * g);
    auto s = std::make_shared<PhaseVars>(e, phase->what + " scratch", n, pieces * g);
    auto rv = std::make_shared<PhaseVars>(e, phase->what + " rail", n, pieces * m);
    auto rs = std::make_shared<PhaseVars>(e, phase->what + " rail scratch", n, pieces * m);
    // Per member, step order: NVLink copies (0), adds (1), NIC copies (2).
    auto order = std::make_shared<PhaseVars>(e, phase->what + " order", n, 3);
    auto name = [&](const char* what, int p, int t, int c) {
      return phase->what + " " + what + " " + std::to_string(t) + " piece " + std::to_string(p) + " chunk " +
             std::to_string(c);
    };
    auto with = [](std::vector<Var> vars, const Var& more) {
      vars.push_back(more);
      return vars;
    };
    // A copy of [k) from member src into member dst's tensor (or scratch):
    // over NVLink on dst's peer stream; across nodes on the stream of dst's
    // copies off the device (its NIC's DMA), so that the rail's copies run
    // beside the node's.
    auto copy = [&](int src, int dst, Chunk k, bool into_scratch, bool nic, std::vector<Var> reads,
                    std::vector<Var> writes, std::string label) {
      const auto bytes = static_cast<std::size_t>(k.size()) * sizeof(float);
      step(e, phase, at(devices, dst), std::move(reads), with(std::move(writes), order->at(dst, nic ? 2 : 0)),
           nic ? OpProperty::copy_from_device : OpProperty::copy_peer, priority, std::move(label),
           [phase, src, dst, n, k, bytes, into_scratch, from = at(devices, src)](RunContext& ctx) {
             copy_in(ctx, phase->out_f(into_scratch ? n + dst : dst) + k.begin, phase->out_f(src) + k.begin, from,
                     bytes);
           });
    };
    auto add = [&](int dst, Chunk k, bool last, std::vector<Var> reads, std::vector<Var> writes, std::string label) {
      step(e, phase, at(devices, dst), std::move(reads), with(std::move(writes), order->at(dst, 1)), kReduceProperty,
           priority, std::move(label), [phase, dst, n, k, op, last](RunContext& ctx) {
             float* d = phase->out_f(dst) + k.begin;
             accumulate(ctx, d, phase->out_f(n + dst) + k.begin, k.size(), accumulate_of(op));
             if (last) finish_average(ctx, d, k.size(), op, n);
           });
    };
    auto all_parts = [&](const std::shared_ptr<PhaseVars>& vars, int r, int p) {
      std::vector<Var> out;
      for (int j = 0; j < m; ++j) out.push_back(vars->at(r, p * m + j));
      return out;
    };
    // 1. Reduce-scatter inside each node (NVLink): node member i ends with
    //    the node's sum of region i + 1 of the piece.
    auto node_reduce_scatter = [&](int p) {
      for (int t = 0; t + 1 < g; ++t)
        for (const std::vector<int>& node : nodes)
          for (int i = 0; i < g; ++i) {
            const int src = node[static_cast<std::size_t>(i)], dst = node[static_cast<std::size_t>((i + 1) % g)];
            const int c = ((i - t) % g + g) % g, f = p * g + c;
            copy(src, dst, region(p, c), true, false, {v->at(src, f)}, {s->at(dst, f)},
                 name("node reduce-scatter copy", p, t, c));
            add(dst, region(p, c), false, {s->at(dst, f)}, {v->at(dst, f)}, name("node reduce-scatter add", p, t, c));
          }
    };
    // 2. Per rail (the members in the same place in their nodes, each on
    //    its own NIC): a ring allreduce of that region across the nodes.
    auto rail_allreduce = [&](int p) {
      for (int l = 0; l < g; ++l) {
        const int c = (l + 1) % g, f = p * g + c;
        auto rail = [&](int a) { return nodes[static_cast<std::size_t>(((a % m) + m) % m)][static_cast<std::size_t>(l)]; };
        for (int t = 0; t + 1 < m; ++t)
          for (int a = 0; a < m; ++a) {
            const int src = rail(a), dst = rail(a + 1), j = ((a - t) % m + m) % m, q = p * m + j;
            // Into the scratch of dst's region, once the node's last add there has read it.
            copy(src, dst, part(p, c, j), true, true, {v->at(src, f), rv->at(src, q)}, {rs->at(dst, q), s->at(dst, f)},
                 name("rail reduce-scatter copy", p, t, q));
            add(dst, part(p, c, j), t + 2 == m, {rs->at(dst, q), v->at(dst, f)}, {rv->at(dst, q)},
                name("rail reduce-scatter add", p, t, q));
          }
        for (int t = 0; t + 1 < m; ++t)
          for (int a = 0; a < m; ++a) {
            const int src = rail(a), dst = rail(a + 1), j = ((a + 1 - t) % m + m) % m, q = p * m + j;
            copy(src, dst, part(p, c, j), false, true, {rv->at(src, q)}, {rv->at(dst, q)},
                 name("rail all-gather copy", p, t, q));
          }
      }
    };
    // 3. All-gather inside each node: a member's region only once its rail is done.
    auto node_all_gather = [&](int p) {
      for (int t = 0; t + 1 < g; ++t)
        for (const std::vector<int>& node : nodes)
          for (int i = 0; i < g; ++i) {
            const int src = node[static_cast<std::size_t>(i)], dst = node[static_cast<std::size_t>((i + 1) % g)];
            const int c = ((i + 1 - t) % g + g) % g, f = p * g + c;
            std::vector<Var> reads = {v->at(src, f)};
            if (t == 0) reads = with(all_parts(rv, src, p), v->at(src, f));  // src's own region, reduced on its rail
            copy(src, dst, region(p, c), false, false, std::move(reads), {v->at(dst, f)},
                 name("node all-gather copy", p, t, c));
          }
    };
    // Pushed in pipeline order: each stream runs its steps in push order.
    for (int p = 0; p < pieces + 2; ++p) {
      if (p < pieces) node_reduce_scatter(p);
      if (p >= 1 && p - 1 < pieces) rail_allreduce(p - 1);
      if (p >= 2) node_all_gather(p - 2);
    }
    push_gpu_done(e, phase, {v, s, rv, rs, order}, devices.front(), priority);
  });
}

// ---- broadcast and reduce --------------------------------------------------------------

void LocalGpuTransport::broadcast(const Call& call, const std::vector<Tensor>& tensors) {
  const int n = static_cast<int>(devices_.size()), root = call.options().root, priority = call.options().priority;
  const std::size_t bytes = tensors[0].nbytes();
  // The root's tensor is read, the others written.
  push_gpu_hold(call, {at(tensors, root)}, all_but(tensors, root),
                [devices = devices_, n, root, bytes, priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    auto v = std::make_shared<PhaseVars>(e, phase->what, n, 1);
    const Device from = at(devices, root);
    for (int r = 0, slot = 0; r < n; ++r) {
      if (r == root) continue;
      step(e, phase, at(devices, r), {}, {v->at(r, 0)}, OpProperty::copy_peer, priority,
           phase->what + " to member " + std::to_string(r),
           [phase, slot, bytes, from](RunContext& ctx) { copy_in(ctx, phase->out_at(slot), phase->in_at(0), from, bytes); });
      ++slot;
    }
    push_gpu_done(e, phase, {v}, devices.front(), priority);
  });
}

void LocalGpuTransport::reduce(const Call& call, const std::vector<Tensor>& tensors, ReduceOp op) {
  const int n = static_cast<int>(devices_.size()), root = call.options().root, priority = call.options().priority;
  if (is_half(tensors[0].dtype())) {
    const std::vector<Tensor> wide = widened(tensors);
    reduce(call, wide, op);
    return narrow_into({at(tensors, root)}, {at(wide, root)}, call.label(), priority);
  }
  const std::int64_t count = tensors[0].numel();
  // Read: the others in member order, then the root (reduced in place);
  // written: the root's tensor and a scratch buffer beside it.
  std::vector<Tensor> reads = all_but(tensors, root);
  reads.push_back(at(tensors, root));
  std::vector<Tensor> writes = {at(tensors, root)};
  if (n > 1) writes.push_back(scratch(call, root, count));
  push_gpu_hold(call, reads, writes,
                [devices = devices_, n, count, op, root, priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    // Per chunk, the others' parts come in one after the other through the
    // scratch chunk and are added to the root's; chunks pipeline.
    auto v = std::make_shared<PhaseVars>(e, phase->what, 1, n);
    auto s = std::make_shared<PhaseVars>(e, phase->what + " scratch", 1, n);
    for (int c = 0; c < n; ++c) {
      const Chunk k = chunk(count, n, c);
      const auto bytes = static_cast<std::size_t>(k.size()) * sizeof(float);
      for (int m = 0, slot = 0; m < n; ++m) {
        if (m == root) continue;
        const Device from = at(devices, m);
        const std::string part = phase->what + " member " + std::to_string(m) + " chunk " + std::to_string(c);
        step(e, phase, at(devices, root), {}, {s->at(0, c)}, OpProperty::copy_peer, priority, part + " copy",
             [phase, slot, k, bytes, from](RunContext& ctx) {
               copy_in(ctx, phase->out_f(1) + k.begin, phase->in_f(slot) + k.begin, from, bytes);
             });
        const bool last = slot + 2 == n;
        step(e, phase, at(devices, root), {s->at(0, c)}, {v->at(0, c)}, kReduceProperty, priority, part + " add",
             [phase, k, op, last, n](RunContext& ctx) {
               float* d = phase->out_f(0) + k.begin;
               accumulate(ctx, d, phase->out_f(1) + k.begin, k.size(), accumulate_of(op));
               if (last) finish_average(ctx, d, k.size(), op, n);
             });
        ++slot;
      }
    }
    push_gpu_done(e, phase, {v, s}, devices.front(), priority);
  });
}

// ---- reduce-scatter and all-gather --------------------------------------------------

void LocalGpuTransport::reduce_scatter(const Call& call, const std::vector<Tensor>& inputs,
                                       const std::vector<Tensor>& outputs, ReduceOp op) {
  const int n = static_cast<int>(devices_.size()), priority = call.options().priority;
  const std::int64_t count = inputs[0].numel();
  if (is_half(inputs[0].dtype())) {
    std::vector<Tensor> wide_outputs;
    for (const Tensor& o : outputs) wide_outputs.push_back(Tensor::empty(o.engine(), o.shape(), o.device()));
    reduce_scatter(call, widened(inputs), wide_outputs, op);
    return narrow_into(outputs, wide_outputs, call.label(), priority);
  }
  // Written: the outputs, then a scratch buffer of its chunk per member.
  std::vector<Tensor> writes = outputs;
  if (n > 1)
    for (int r = 0; r < n; ++r) writes.push_back(scratch(call, r, chunk(count, n, r).size()));
  push_gpu_hold(call, inputs, writes,
                [devices = devices_, n, count, op, priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    // Member r: its output starts as member 0's chunk r, then member m's
    // chunk r is added for m = 1 .. n - 1 (through its scratch unless m is r).
    auto o = std::make_shared<PhaseVars>(e, phase->what, n, 1);
    auto s = std::make_shared<PhaseVars>(e, phase->what + " scratch", n, 1);
    for (int r = 0; r < n; ++r) {
      const Chunk k = chunk(count, n, r);
      const auto bytes = static_cast<std::size_t>(k.size()) * sizeof(float);
      const std::string on = phase->what + " on member " + std::to_string(r);
      step(e, phase, at(devices, r), {}, {o->at(r, 0)}, OpProperty::copy_peer, priority, on + " from member 0",
           [phase, r, k, bytes, from = at(devices, 0)](RunContext& ctx) {
             copy_in(ctx, phase->out_at(r), phase->in_f(0) + k.begin, from, bytes);
           });
      for (int m = 1; m < n; ++m) {
        const bool last = m + 1 == n;
        const std::string part = on + " from member " + std::to_string(m);
        if (m == r) {
          step(e, phase, at(devices, r), {}, {o->at(r, 0)}, kReduceProperty, priority, part,
               [phase, r, k, op, last, n](RunContext& ctx) {
                 accumulate(ctx, phase->out_f(r), phase->in_f(r) + k.begin, k.size(), accumulate_of(op));
                 if (last) finish_average(ctx, phase->out_f(r), k.size(), op, n);
               });
          continue;
        }
        step(e, phase, at(devices, r), {}, {s->at(r, 0)}, OpProperty::copy_peer, priority, part + " copy",
             [phase, r, m, n, k, bytes, from = at(devices, m)](RunContext& ctx) {
               copy_in(ctx, phase->out_at(n + r), phase->in_f(m) + k.begin, from, bytes);
             });
        step(e, phase, at(devices, r), {s->at(r, 0)}, {o->at(r, 0)}, kReduceProperty, priority, part + " add",
             [phase, r, n, k, op, last](RunContext& ctx) {
               accumulate(ctx, phase->out_f(r), phase->out_f(n + r), k.size(), accumulate_of(op));
               if (last) finish_average(ctx, phase->out_f(r), k.size(), op, n);
             });
      }
    }
    push_gpu_done(e, phase, {o, s}, devices.front(), priority);
  });
}

void LocalGpuTransport::all_gather(const Call& call, const std::vector<Tensor>& inputs,
                                   const std::vector<Tensor>& outputs) {
  const int n = static_cast<int>(devices_.size()), priority = call.options().priority;
  const std::int64_t count = outputs[0].numel();
  const std::size_t element = dtype_size(outputs[0].dtype());
  push_gpu_hold(call, inputs, outputs,
                [devices = devices_, n, count, element, priority](Engine& e, const std::shared_ptr<Phase>& phase) {
    // Member r receives member m's input at chunk m of its output: n * n
    // independent copies.
    auto v = std::make_shared<PhaseVars>(e, phase->what, n, n);
    for (int r = 0; r < n; ++r)
      for (int m = 0; m < n; ++m) {
        const Chunk k = chunk(count, n, m);
        // In place: member r's own chunk is there already.
        if (m == r && static_cast<const unsigned char*>(phase->out_at(r)) + static_cast<std::size_t>(k.begin) * element ==
                          phase->in_at(m))
          continue;
        step(e, phase, at(devices, r), {}, {v->at(r, m)}, OpProperty::copy_peer, priority,
             phase->what + " member " + std::to_string(m) + " to member " + std::to_string(r),
             [phase, r, m, k, element, from = at(devices, m)](RunContext& ctx) {
               copy_in(ctx, static_cast<unsigned char*>(phase->out_at(r)) + static_cast<std::size_t>(k.begin) * element,
                       phase->in_at(m), from, static_cast<std::size_t>(k.size()) * element);
             });
      }
    push_gpu_done(e, phase, {v}, devices.front(), priority);
  });
}

// ---- barrier ----------------------------------------------------------------------------

void LocalGpuTransport::barrier(const Call& call) {
  // Every member is driven by this process, which reached the call.
  call.state().engine->push([] {}, kHoldDevice, {}, {}, {.priority = call.options().priority, .name = call.label()});
}

// ---- send and recv: a snapshot on the receiver's GPU, handed over in push order --

void LocalGpuTransport::send(Call& call, const Tensor& tensor, int from, int to) {
  // The copy to the receiver's GPU is pushed now: the sender may overwrite
  // its tensor right after, and the recv takes what it held at the send.
  mailboxes_.post(call, from, to, [&] {
    Tensor snapshot = tensor.copy_to(at(devices_, to));
    snapshot.set_name(call.label());
    return snapshot;
  });
}

void LocalGpuTransport::recv(Call& call, const Tensor& tensor, int from, int to) {
  Tensor snapshot = mailboxes_.take(call, tensor, from, to);
  Tensor into = tensor;
  into.copy_from(snapshot.reshape(tensor.shape()));
}

}  // namespace

std::unique_ptr<Transport> make_local_gpu_transport(CommunicatorState& state) {
  return std::make_unique<LocalGpuTransport>(state);
}

}  // namespace weft::parallel::detail
