// Modeled time on simulated GPUs: a mode of the sim backend in which a GPU
// op's kernel does not compute but takes the time a cost model gives it, its
// stream's thread sleeping meanwhile (holding no core), and copies take the
// time of the links they cross (NVLink within a node, a network between
// nodes, PCIe to the host). The engine, its workers, stream waits, events,
// the allocator and every collective run for real; tensors written by a
// modeled kernel hold no values, and reading them on the host is an error
// naming the mode (ops/); copies of such values take their time and move
// nothing (ScopedUndefinedBytes). Every modeled duration is `dilation` times longer
// on the host clock, so that the host's own costs weigh less against it;
// predicted_seconds() converts measured host time back.
// Set from WEFT_SIM_MODEL (h100 | a profile file | a cost-table file),
// WEFT_SIM_GPUS_PER_NODE and WEFT_SIM_DILATION when the sim backend starts,
// or with set_sim_model(). docs/design/simulated-gpus.md has the model, the
// file formats and the built-in profile's sources.
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
  std::string model;      // "" (off), "h100" (built in), or a profile or cost-table file
  int gpus_per_node = 0;  // 0: every simulated GPU in one node
  double dilation = 1;    // host-clock duration of every modeled duration, per modeled second
};
// From WEFT_SIM_MODEL, WEFT_SIM_GPUS_PER_NODE and WEFT_SIM_DILATION (a bad value: InvalidArgument).
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

// The dilation factor in force (1 when the mode is off).
double sim_dilation() noexcept;
// A duration measured on the host clock under the mode, as the modeled GPUs would take it.
inline double predicted_seconds(double host_seconds) noexcept { return host_seconds / sim_dilation(); }

}  // namespace weft::gpu
