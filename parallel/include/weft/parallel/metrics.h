// weft::parallel metrics — figures read from a profiler's trace of data
// parallel training and pipelines.
//
//   Profiler& p = engine->profiler();   // record a few steps, then:
//   CommOverlap o = comm_overlap(p.spans(), dp.comm_marker());
//   std::vector<double> idle = measured_bubble(p.spans(), pipe.stages());
//
// Each function reads only its arguments (any thread). Spans of launch
// tracks (the host side of GPU work) are left out, as in
// Profiler::summarize. How they are computed: docs/design/data-parallel.md
// ("The overlap figure") and docs/design/pipeline.md ("The bubble").
#pragma once

#include <string_view>
#include <vector>

#include "weft/profiler.h"

namespace weft::parallel {

// How much of the gradient reduction ran while other work did.
struct CommOverlap {
  double comm_ms = 0;    // time during which at least one reduction op ran
  double hidden_ms = 0;  // ... and, at the same time, at least one other op
  double fraction = 0;   // hidden / comm; 0 when nothing was reduced
};
// Reduction ops are the spans whose name contains `marker`
// (DataParallel::comm_marker()).
CommOverlap comm_overlap(const std::vector<Span>& spans, std::string_view marker);

// How much of the host's work ran while GPUs worked: the spans whose name
// contains `marker` (DataParallel::offload_marker(): the offloaded
// optimizer updates) against the GPU side of the streams' spans (the
// time the GPUs ran kernels and copies). Same figures as comm_overlap.
CommOverlap gpu_overlap(const std::vector<Span>& spans, std::string_view marker);

// Per stage, from a profiler's spans of one or more steps: 1 - (time during
// which at least one of the stage's ops ran) / (from the first span's start
// to the last span's end, over all stages). A stage's ops are the spans
// whose name contains Pipeline::span_marker(stage).
std::vector<double> measured_bubble(const std::vector<Span>& spans, int stages);
// The bubble GPipe and 1F1B leave with uniform stages: (K - 1) / (M + K - 1)
// for K stages and M micro-batches.
double predicted_bubble(int stages, int micro_batches) noexcept;
// The theory of a named schedule with equal forward, input-gradient and
// weight-gradient times: gpipe and 1f1b as above, zb-h1 (K - 1) / (3M + K - 1),
// interleaved-1f1b (K - 1) / (vM + K - 1) for v virtual stages. Throws
// weft::InvalidArgument for another name (Schedule::bubble simulates any
// schedule's lists).
double predicted_bubble(std::string_view schedule, int stages, int micro_batches, int virtual_stages = 1);

}  // namespace weft::parallel
