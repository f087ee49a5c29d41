// Modeled time on simulated GPUs: a mode of the sim backend in which a GPU
// op's kernel does not compute but takes the time a cost model gives it,
// and copies take the time of the links they cross (NVLink within a node,
// the NICs between nodes, PCIe to the host). Time is virtual: each stream
// and each link direction keeps a modeled clock that items advance (no
// thread sleeps), the host's launches cost `launch_us` each on their
// stream's issue clock, and the host's clock (modeled_now) moves only when
// the frontend waits for GPU work; a prediction does not depend on how fast
// or loaded the host is. The engine, its workers, stream waits, events, the
// allocator and every collective run for real; tensors written by a modeled
// kernel hold no values, and reading them on the host is an error naming
// the mode (ops/); copies of such values take their time and move nothing
// (ScopedUndefinedBytes).
// Set from WEFT_SIM_MODEL (dgx-h100 | dgx-h200 | dgx-a100 | a profile file | a
// cost-table file) and WEFT_SIM_GPUS_PER_NODE when the sim backend starts,
// or with set_sim_model(). docs/design/simulated-gpus.md has the model, the
// file formats and the built-in profiles' sources.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "weft/gpu.h"

namespace weft::gpu {

// Which peak rate an op's arithmetic runs at.
enum class Math : unsigned char { fp32, tf32, bf16, fp16 };
std::string_view to_string(Math math) noexcept;

struct SimModelOptions {
  std::string model;      // "" (off), "dgx-h100", "dgx-h200", "dgx-a100" (built in), or a profile or cost-table file
  int gpus_per_node = 0;  // 0: the profile's (8 for the DGX profiles)
};
// From WEFT_SIM_MODEL and WEFT_SIM_GPUS_PER_NODE (a bad value: InvalidArgument).
SimModelOptions sim_model_from_env();

// Sets the model of the active sim backend for work enqueued from now on
// (work already enqueued keeps its times); an empty `model` turns the mode
// off. InvalidArgument when the sim backend is not active, for an unknown
// name, or for a malformed file (naming the file and the line).
void set_sim_model(const SimModelOptions& options);
SimModelOptions sim_model();  // the current options (model empty: off)
// Whether GPU kernels are modeled (one atomic load).
bool kernels_modeled() noexcept;

// One kernel as the cost model sees it.
struct KernelCost {
  std::string_view op;     // the op's name, as a cost table lists it ("matmul")
  std::string_view shape;  // its operands, as a cost table lists them ("float32[64,784];float32[784,10]->...")
  double flops = 0;        // arithmetic; 0: bandwidth-bound
  double bytes = 0;        // device memory read and written
  Math math = Math::fp32;
  double parallel = 0;     // independent outputs of a compute-bound kernel (0: enough to fill the GPU)
};
// Enqueues `cost`'s modeled time on a simulated GPU's stream (the mode must be on).
void launch_modeled_kernel(Stream* stream, const KernelCost& cost);
// The predicted (undilated) time of a kernel, in seconds; counts it in the stats.
double modeled_kernel_seconds(const KernelCost& cost);

// While one lives, the copies this thread enqueues on simulated GPUs move
// undefined bytes: in the modeled mode the sim backend gives each device or
// peer copy its modeled time (links, bandwidth, latency, as any copy) and
// moves nothing. Copies to or from the host always move their bytes. Set by
// ops/ around a copy whose source holds no values, and by the in-process
// GPU collectives under the mode; nested scopes restore the outer setting.
class ScopedUndefinedBytes {
 public:
  explicit ScopedUndefinedBytes(bool undefined = true) noexcept;
  ~ScopedUndefinedBytes();
  ScopedUndefinedBytes(const ScopedUndefinedBytes&) = delete;
  ScopedUndefinedBytes& operator=(const ScopedUndefinedBytes&) = delete;

 private:
  bool saved_;
};
// Whether this thread's copies move undefined bytes (ScopedUndefinedBytes).
bool copies_move_undefined_bytes() noexcept;

struct SimModelStats {
  std::uint64_t kernels = 0;     // modeled kernels
  std::uint64_t from_table = 0;  // of which a cost table gave the time
  std::uint64_t fallbacks = 0;   // of which a cost table lacked the op: the profile gave it
  std::uint64_t bytes_moved = 0;    // bytes the modeled copies moved (memcpy)
  std::uint64_t bytes_skipped = 0;  // bytes of modeled copies of undefined bytes: timed, not moved
  std::map<std::string, std::uint64_t> missing;  // "op shape" the table lacked -> count
};
SimModelStats sim_model_stats();  // since the mode was last set
// "t.txt: 97 kernel(s) modeled, 88 from the cost table t.txt, 9 fell back to the
// profile h100 (full ->float32[10] x1; ...)": the model, then the counts.
std::string sim_model_report();

// The host's modeled clock, in seconds on the modeled timeline: where the
// frontend's last wait for GPU work (wait_all, wait_to_read, a stream or
// event synchronize) left it. After wait_all it is the end of the last
// modeled item on any stream; the difference over a step is the step's
// predicted time. 0 when the mode is off.
double modeled_now() noexcept;

// The GPU ops an engine worker runs for an op pushed at modeled host time
// `seconds` are issued no earlier than that (the engine sets it around an
// op's body, so work pushed before a wait is not placed after it).
class ScopedModeledIssue {
 public:
  explicit ScopedModeledIssue(double seconds) noexcept;
  ~ScopedModeledIssue();
  ScopedModeledIssue(const ScopedModeledIssue&) = delete;
  ScopedModeledIssue& operator=(const ScopedModeledIssue&) = delete;

 private:
  std::int64_t saved_;
};
// The modeled host time of work this thread issues now: the op's push time
// inside an engine op (ScopedModeledIssue, advanced by its host waits), else
// modeled_now(). Negative when the mode is off.
double modeled_issue_time() noexcept;

// The node layout of simulated GPUs, so that collectives can choose
// hierarchical schemes: the model's in force; with the mode off,
// WEFT_SIM_GPUS_PER_NODE's (with the dgx-h100 profile's links), so that the
// multi-node forms also run on real values. gpus_per_node 0: one node.
struct SimTopology {
  int gpus_per_node = 0;
  int nics_per_node = 0;
  double nvlink_gbps = 0, nic_gbps = 0;  // per GPU each way; per NIC each way (after oversubscription)
  double nvlink_latency_us = 0, nic_latency_us = 0;
  int node_of(int gpu) const noexcept { return gpus_per_node > 0 ? gpu / gpus_per_node : 0; }
};
SimTopology sim_topology();

}  // namespace weft::gpu
