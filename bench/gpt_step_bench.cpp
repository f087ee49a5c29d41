// weft-bench-ops --gpt (bench/gpt_step_bench.h): a GPT training step on the
// CPU, timed, then profiled op by op.
#include "gpt_step_bench.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "cpu/intra_op.h"
#include "measure.h"
#include "weft/engine.h"
#include "weft/nn.h"
#include "weft/optim.h"
#include "weft/profiler.h"
#include "weft/tensor.h"

namespace weft_bench {
namespace {

struct GptCase {
  std::string name;
  weft::nn::GptConfig config;
  std::int64_t batch, seq;
};

std::vector<GptCase> gpt_cases(const GptStepOptions& o) {
  std::vector<GptCase> out;
  if (o.model == "tiny" || o.model == "all") {
    out.push_back({"tiny", weft::nn::GptConfig::tiny(), o.batch > 0 ? o.batch : 16, 128});
  }
  if (o.model == "6x384" || o.model == "all") {
    // nanoGPT's character-level model: 6 layers, 6 heads, width 384,
    // context 256, over bytes.
    weft::nn::GptConfig c = weft::nn::GptConfig::tiny();
    c.layers = 6;
    c.heads = 6;
    c.width = 384;
    c.context = 256;
    out.push_back({"6x384", c, o.batch > 0 ? o.batch : 8, 256});
  }
  return out;
}

std::vector<float> random_ids(std::int64_t n, std::int64_t vocab, std::uint32_t salt) {
  std::mt19937 rng(salt);
  std::uniform_int_distribution<std::int64_t> pick(0, vocab - 1);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(pick(rng));
  return v;
}

void run_case(const GptStepOptions& o, const GptCase& c) {
  using namespace weft;
  auto engine = Engine::create(EngineConfig{.kind = "threaded"});
  const Device dev = Device::cpu(0);
  auto model = nn::gpt(*engine, c.config, dev, 1);
  optim::Optimizer opt(model->parameters(), optim::OptimizerOptions::adamw(1e-3f));
  const Shape shape{c.batch, c.seq};
  const Tensor ids = Tensor::from_host(*engine, shape, random_ids(c.batch * c.seq, c.config.vocab, 1), dev);
  const Tensor targets = Tensor::from_host(*engine, shape, random_ids(c.batch * c.seq, c.config.vocab, 2), dev);
  float loss = 0.0f;
  auto step = [&] {
    const Tensor logits = model->forward(ids);
    ops::SoftmaxCrossEntropy l = nn::lm_loss(logits, targets);
    model->backward(l.dlogits);
    opt.step();
    engine->wait_all();
    loss = l.loss.item();
  };
  step();  // warm-up: the allocator's caches, OpenBLAS's buffers
  step();
  std::vector<double> ms;
  for (int r = 0; r < o.reps; ++r) {
    Stopwatch sw;
    step();
    ms.push_back(sw.seconds() * 1e3);
  }
  const Summary s = summarize(ms);
  const double tokens = static_cast<double>(c.batch * c.seq);
  const int workers = engine->workers(dev);
  const int intra = kernels::cpu::intra_op_threads();
  if (o.json)
    std::printf(
        "{\"case\":\"gpt_step\",\"model\":\"%s\",\"layers\":%lld,\"heads\":%lld,\"width\":%lld,\"vocab\":%lld,"
        "\"batch\":%lld,\"seq\":%lld,\"workers\":%d,\"intra_op_threads\":%d,\"step_ms\":%.3f,\"step_ms_min\":%.3f,"
        "\"step_ms_max\":%.3f,\"tokens_per_s\":%.1f,\"loss\":%.5f,\"reps\":%d}\n",
        c.name.c_str(), static_cast<long long>(c.config.layers), static_cast<long long>(c.config.heads),
        static_cast<long long>(c.config.width), static_cast<long long>(c.config.vocab),
        static_cast<long long>(c.batch), static_cast<long long>(c.seq), workers, intra, s.median, s.min, s.max,
        tokens / (s.median * 1e-3), static_cast<double>(loss), o.reps);
  else
    std::printf("gpt_step %-6s batch %lld seq %lld, %d workers, %d intra-op threads: %.1f ms/step (min %.1f, max "
                "%.1f), %.0f tokens/s, loss %.4f\n",
                c.name.c_str(), static_cast<long long>(c.batch), static_cast<long long>(c.seq), workers, intra,
                s.median, s.min, s.max, tokens / (s.median * 1e-3), static_cast<double>(loss));
  std::fflush(stdout);
  if (!o.profile) return;
  // The breakdown: a separate pass, so that recording costs nothing above.
  const int profiled = std::max(2, o.reps / 2);
  Profiler& prof = engine->profiler();
  prof.clear();
  prof.start();
  for (int r = 0; r < profiled; ++r) step();
  prof.stop();
  const ProfileSummary sum = prof.summarize();
  double busy_ms = 0;
  for (const ResourceUsage& u : sum.resources)
    if (u.device == dev) busy_ms += u.busy_ms;
  const std::vector<OpStats> stats = prof.aggregate();
  double total_us = 0;
  for (const OpStats& st : stats) total_us += st.total_us;
  if (o.json)
    std::printf("{\"case\":\"gpt_step_profile\",\"model\":\"%s\",\"steps\":%d,\"window_ms_per_step\":%.3f,"
                "\"busy_ms_per_step\":%.3f,\"ops_per_step\":%.1f}\n",
                c.name.c_str(), profiled, sum.window_ms / profiled, busy_ms / profiled,
                [&] {
                  double n = 0;
                  for (const OpStats& st : stats) n += static_cast<double>(st.count);
                  return n / profiled;
                }());
  else
    std::printf("  profiled %d steps: %.1f ms window/step, %.1f ms busy/step (all workers)\n", profiled,
                sum.window_ms / profiled, busy_ms / profiled);
  for (const OpStats& st : stats) {
    const double share = total_us > 0 ? st.total_us / total_us : 0;
    if (o.json)
      std::printf("{\"case\":\"gpt_step_op\",\"model\":\"%s\",\"op\":\"%s\",\"count_per_step\":%.1f,"
                  "\"ms_per_step\":%.3f,\"share\":%.4f}\n",
                  c.name.c_str(), st.name.c_str(), static_cast<double>(st.count) / profiled,
                  st.total_us / 1e3 / profiled, share);
    else if (share >= 0.002)
      std::printf("  %-40s %7.1f ops %9.2f ms %6.1f%%\n", st.name.c_str(), static_cast<double>(st.count) / profiled,
                  st.total_us / 1e3 / profiled, share * 100);
  }
  std::fflush(stdout);
}

}  // namespace

int run_gpt_step_bench(const GptStepOptions& options) {
  const std::vector<GptCase> cases = gpt_cases(options);
  if (cases.empty()) {
    std::fprintf(stderr, "weft-bench-ops: --gpt-model wants tiny, 6x384 or all, not '%s'\n", options.model.c_str());
    return 2;
  }
  for (const GptCase& c : cases) run_case(options, c);
  return 0;
}

}  // namespace weft_bench
