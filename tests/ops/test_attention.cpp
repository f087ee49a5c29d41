// Causal scaled dot-product attention (ops::causal_attention and its
// backward) on CPU devices: the forward and the row log-sum-exp against a
// naive float64 reference (the full masked softmax), in float32 and the half
// dtypes; the gradients against float64 central finite differences; the
// kernel's scratch and the device allocator's peak not growing with T^2;
// and named shape errors. Each
// scenario on the naive engine and the threaded one at every worker count,
// for sequence lengths that are not multiples of the block.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/intra_op.h"
#include "test_workers.h"
#include "weft/allocator.h"
#include "weft/dtype.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn_ops.h"
#include "weft/tensor.h"

namespace {

using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace ops = weft::ops;
namespace k = weft::kernels::cpu;
using i64 = std::int64_t;

struct EngineSpec {
  std::string kind;
  int workers;
  std::string str() const { return kind + "/" + std::to_string(workers); }
};

std::vector<EngineSpec> engines() {
  std::vector<EngineSpec> out{{"naive", 1}};
  for (int w : weft_test::worker_counts()) out.push_back({"threaded", w});
  return out;
}

std::unique_ptr<Engine> make_engine(const EngineSpec& s) {
  return Engine::create(weft::EngineConfig{.kind = s.kind, .workers_per_cpu_device = s.workers});
}

class IntraOpThreads {
 public:
  explicit IntraOpThreads(int n) : saved_(k::intra_op_threads()) { k::set_intra_op_threads(n); }
  ~IntraOpThreads() { k::set_intra_op_threads(saved_); }
  IntraOpThreads(const IntraOpThreads&) = delete;
  IntraOpThreads& operator=(const IntraOpThreads&) = delete;

 private:
  int saved_;
};

double unit(DType t) { return t == DType::bfloat16 ? 0x1p-8 : t == DType::float16 ? 0x1p-11 : 0x1p-24; }

float round_to(DType t, float v) {
  if (t == DType::bfloat16) return weft::bfloat16_to_float(weft::float_to_bfloat16(v));
  if (t == DType::float16) return weft::float16_to_float(weft::float_to_float16(v));
  return v;
}

std::vector<float> random_values(i64 n, std::uint64_t stream, DType t = DType::float32) {
  std::mt19937_64 rng(stream);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = round_to(t, d(rng));
  return v;
}

// The naive reference of one plane (t rows of width d): the full t x t
// masked score matrix, its softmax, and out = P v, all in float64.
struct PlaneRef {
  std::vector<double> out, lse;
};
PlaneRef reference_plane(const double* q, const double* kk, const double* v, i64 t, i64 d, double scale) {
  PlaneRef r{std::vector<double>(static_cast<std::size_t>(t * d), 0.0), std::vector<double>(static_cast<std::size_t>(t))};
  std::vector<double> s(static_cast<std::size_t>(t * t), -std::numeric_limits<double>::infinity());
  for (i64 i = 0; i < t; ++i)
    for (i64 j = 0; j <= i; ++j) {
      double acc = 0;
      for (i64 c = 0; c < d; ++c) acc += q[i * d + c] * kk[j * d + c];
      s[static_cast<std::size_t>(i * t + j)] = acc * scale;
    }
  for (i64 i = 0; i < t; ++i) {
    double m = -std::numeric_limits<double>::infinity();
    for (i64 j = 0; j < t; ++j) m = std::max(m, s[static_cast<std::size_t>(i * t + j)]);
    double sum = 0;
    for (i64 j = 0; j < t; ++j) sum += std::exp(s[static_cast<std::size_t>(i * t + j)] - m);
    r.lse[static_cast<std::size_t>(i)] = m + std::log(sum);
    for (i64 j = 0; j < t; ++j) {
      const double p = std::exp(s[static_cast<std::size_t>(i * t + j)] - m) / sum;
      for (i64 c = 0; c < d; ++c) r.out[static_cast<std::size_t>(i * d + c)] += p * v[j * d + c];
    }
  }
  return r;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

struct Case {
  i64 b, h, t, d;
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "[" + std::to_string.
  std::string str() const {
    std::string s = "[";
    s += std::to_string(b);
    s += ", ";
    s += std::to_string(h);
    s += ", ";
    s += std::to_string(t);
    s += ", ";
    s += std::to_string(d);
    s += "]";
    return s;
  }
};

}  // namespace

TEST_CASE("causal_attention matches a float64 reference for every T, dtype and engine" * doctest::timeout(240)) {
  const Case cases[] = {{1, 1, 1, 8}, {2, 3, 7, 16}, {1, 2, 64, 32}, {2, 2, 130, 8}, {1, 1, 130, 64}};
  const Device cpu = Device::cpu(0);
  for (const EngineSpec& spec : engines()) {
    auto e = make_engine(spec);
    for (DType dt : {DType::float32, DType::bfloat16, DType::float16}) {
      for (const Case& c : cases) {
        CAPTURE(spec.str());
        const std::string dtype_name(weft::to_string(dt));
        CAPTURE(dtype_name);
        CAPTURE(c.str());
        const Shape s{c.b, c.h, c.t, c.d};
        const i64 n = s.numel();
        const auto qv = random_values(n, 11 + static_cast<std::uint64_t>(c.t), dt);
        const auto kv = random_values(n, 23 + static_cast<std::uint64_t>(c.t), dt);
        const auto vv = random_values(n, 37 + static_cast<std::uint64_t>(c.t), dt);
        const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
        Tensor q = Tensor::from_host(*e, s, qv, cpu, dt), kt = Tensor::from_host(*e, s, kv, cpu, dt),
               v = Tensor::from_host(*e, s, vv, cpu, dt);
        ops::CausalAttention a = ops::causal_attention(q, kt, v, scale);
        REQUIRE(a.out.dtype() == dt);
        REQUIRE(a.out.shape() == s);
        REQUIRE(a.lse.dtype() == DType::float32);
        REQUIRE(a.lse.shape() == Shape{c.b, c.h, c.t});
        const std::vector<float> out = a.out.to_host(), lse = a.lse.to_host();
        const auto qd = widen(qv), kd = widen(kv), vd = widen(vv);
        // float32 arithmetic over D-long dot products and T-long sums, and
        // for halves the output's rounding on top.
        const double f32 = 8.0 * 0x1p-24 * static_cast<double>(c.d + c.t);
        const double tol_out = f32 + (dt == DType::float32 ? 0.0 : unit(dt));
        double worst = 0;
        for (i64 p = 0; p < c.b * c.h; ++p) {
          const i64 off = p * c.t * c.d;
          const PlaneRef r = reference_plane(qd.data() + off, kd.data() + off, vd.data() + off, c.t, c.d, scale);
          for (i64 i = 0; i < c.t * c.d; ++i) {
            const double want = r.out[static_cast<std::size_t>(i)];
            const double err = std::abs(out[static_cast<std::size_t>(off + i)] - want);
            worst = std::max(worst, err / (1.0 + std::abs(want)));
          }
          for (i64 i = 0; i < c.t; ++i) {
            const double want = r.lse[static_cast<std::size_t>(i)];
            CHECK(std::abs(lse[static_cast<std::size_t>(p * c.t + i)] - want) <= f32 * (1.0 + std::abs(want)));
          }
        }
        CHECK(worst <= tol_out);
      }
    }
  }
}

TEST_CASE("causal_attention_backward matches float64 central differences" * doctest::timeout(240)) {
  // L(q, k, v) = sum(out * r): dout = r, and each gradient element is
  // compared with (L(x + h) - L(x - h)) / 2h of the float64 reference.
  const Case cases[] = {{1, 1, 1, 4}, {2, 2, 7, 8}, {1, 1, 70, 8}, {1, 1, 130, 4}};
  const Device cpu = Device::cpu(0);
  for (const EngineSpec& spec : engines()) {
    auto e = make_engine(spec);
    for (const Case& c : cases) {
      CAPTURE(spec.str());
      CAPTURE(c.str());
      const Shape s{c.b, c.h, c.t, c.d};
      const i64 n = s.numel(), plane = c.t * c.d;
      const auto qv = random_values(n, 101), kv = random_values(n, 102), vv = random_values(n, 103),
                 rv = random_values(n, 104);
      const float scale = 1.0f / std::sqrt(static_cast<float>(c.d));
      Tensor q = Tensor::from_host(*e, s, qv, cpu), kt = Tensor::from_host(*e, s, kv, cpu),
             v = Tensor::from_host(*e, s, vv, cpu), r = Tensor::from_host(*e, s, rv, cpu);
      ops::CausalAttention a = ops::causal_attention(q, kt, v, scale);
      ops::CausalAttentionGrads g = ops::causal_attention_backward(q, kt, v, a.out, r, a.lse, scale);
      const std::vector<float> grads[3] = {g.dq.to_host(), g.dk.to_host(), g.dv.to_host()};
      std::vector<double> x[3] = {widen(qv), widen(kv), widen(vv)};
      const auto rd = widen(rv);
      const double h = 1e-4;
      for (i64 p = 0; p < c.b * c.h; ++p) {
        const i64 off = p * plane;
        auto loss = [&] {
          const PlaneRef pr =
              reference_plane(x[0].data() + off, x[1].data() + off, x[2].data() + off, c.t, c.d, scale);
          double l = 0;
          for (i64 i = 0; i < plane; ++i) l += pr.out[static_cast<std::size_t>(i)] * rd[static_cast<std::size_t>(off + i)];
          return l;
        };
        for (int which = 0; which < 3; ++which) {
          double worst = 0;
          for (i64 i = off; i < off + plane; ++i) {
            double& xi = x[which][static_cast<std::size_t>(i)];
            const double saved = xi;
            xi = saved + h;
            const double up = loss();
            xi = saved - h;
            const double down = loss();
            xi = saved;
            const double numeric = (up - down) / (2 * h);
            const double err = std::abs(grads[which][static_cast<std::size_t>(i)] - numeric);
            worst = std::max(worst, err / (1e-3 + std::abs(numeric)));
          }
          CAPTURE(which);
          CAPTURE(p);
          // float32 gradients against float64 differences (truncation ~h^2).
          CHECK(worst <= 1e-3);
        }
      }
    }
  }
}

TEST_CASE("causal_attention's scratch does not grow with T^2" * doctest::timeout(240)) {
  // The kernel's scratch (every piece's buffers held at once) at T = 1024
  // against T = 256, with the same intra-op threads: a T x T score matrix
  // per plane would grow 16x; blocks of kAttentionBlock x kAttentionBlock do
  // not grow at all, and never exceed one tile set per intra-op thread. The
  // device allocator's peak over the forward is its outputs (O(T D)).
  const Device cpu = Device::cpu(0);
  for (int threads : {1, 2}) {
    IntraOpThreads guard(threads);
    auto e = Engine::create(weft::EngineConfig{.kind = "threaded", .workers_per_cpu_device = 1});
    const i64 b = 1, hh = 2, d = 32;
    std::size_t fwd_peak[2] = {0, 0}, bwd_peak[2] = {0, 0};
    const i64 ts[2] = {256, 1024};
    for (int which = 0; which < 2; ++which) {
      const i64 t = ts[which];
      const Shape s{b, hh, t, d};
      Tensor q = Tensor::uniform(*e, s, -1, 1, 1, cpu), kt = Tensor::uniform(*e, s, -1, 1, 2, cpu),
             v = Tensor::uniform(*e, s, -1, 1, 3, cpu), r = Tensor::uniform(*e, s, -1, 1, 4, cpu);
      q.wait_to_read();
      kt.wait_to_read();
      v.wait_to_read();
      r.wait_to_read();
      e->wait_all();
      const std::size_t held = weft::memory_stats(*e, cpu).in_use;
      e->allocator(cpu).reset_peak();
      k::reset_attention_scratch_peak();
      ops::CausalAttention a = ops::causal_attention(q, kt, v, 0.125f);
      a.out.wait_to_read();
      a.lse.wait_to_read();
      fwd_peak[which] = k::attention_scratch_peak_bytes();
      // The device's allocator takes the outputs and nothing that grows with T^2.
      const std::size_t outputs = a.out.nbytes() + a.lse.nbytes();
      const std::size_t taken = weft::memory_stats(*e, cpu).peak_in_use - held;
      CAPTURE(t);
      CAPTURE(taken);
      CHECK(taken >= outputs);
      CHECK(taken <= 2 * outputs);
      k::reset_attention_scratch_peak();
      ops::CausalAttentionGrads g = ops::causal_attention_backward(q, kt, v, a.out, r, a.lse, 0.125f);
      g.dq.wait_to_read();
      g.dk.wait_to_read();
      g.dv.wait_to_read();
      bwd_peak[which] = k::attention_scratch_peak_bytes();
    }
    MESSAGE("attention scratch peak, " << threads << " intra-op threads: forward " << fwd_peak[0] << " B at T=256, "
                                       << fwd_peak[1] << " B at T=1024; backward " << bwd_peak[0] << " B, " << bwd_peak[1]
                                       << " B");
    CAPTURE(threads);
    CAPTURE(fwd_peak[0]);
    CAPTURE(fwd_peak[1]);
    CAPTURE(bwd_peak[0]);
    CAPTURE(bwd_peak[1]);
    constexpr std::size_t blk = k::kAttentionBlock;
    const std::size_t fwd_piece = (blk * blk + blk * d + 2 * blk) * sizeof(float);
    const std::size_t bwd_piece = (2 * blk * blk + blk) * sizeof(float);
    const auto t_threads = static_cast<std::size_t>(threads);
    CHECK(fwd_peak[0] > 0);
    CHECK(bwd_peak[0] > 0);
    CHECK(fwd_peak[1] <= t_threads * fwd_piece);
    CHECK(bwd_peak[1] <= t_threads * bwd_piece);
    CHECK(fwd_peak[1] <= 4 * fwd_peak[0]);
    CHECK(bwd_peak[1] <= 4 * bwd_peak[0]);
    // One plane's T x T float32 scores at T = 1024 would be 4 MiB.
    CHECK(fwd_peak[1] * 16 < static_cast<std::size_t>(1024 * 1024) * sizeof(float));
  }
}

TEST_CASE("causal_attention names the tensor and shape of bad input" * doctest::timeout(60)) {
  auto e = Engine::create(weft::EngineConfig{.kind = "naive"});
  const Device cpu = Device::cpu(0);
  const Shape s{1, 2, 5, 4};
  Tensor q = Tensor::zeros(*e, s, cpu), kt = Tensor::zeros(*e, s, cpu), v = Tensor::zeros(*e, s, cpu);
  auto message = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const weft::Error& err) {
      return err.what();
    }
    return "(no error)";
  };
  SUBCASE("rank") {
    Tensor flat = Tensor::zeros(*e, Shape{2, 5, 4}, cpu).set_name("q3");
    const std::string m = message([&] { ops::causal_attention(flat, kt, v, 0.5f); });
    CHECK(m.find("causal_attention") != std::string::npos);
    CHECK(m.find("q3") != std::string::npos);
  }
  SUBCASE("shape mismatch") {
    Tensor kk = Tensor::zeros(*e, Shape{1, 2, 6, 4}, cpu).set_name("keys");
    const std::string m = message([&] { ops::causal_attention(q, kk, v, 0.5f); });
    CHECK(m.find("causal_attention: k") != std::string::npos);
    CHECK(m.find("keys") != std::string::npos);
    CHECK(m.find("[1, 2, 6, 4]") != std::string::npos);
  }
  SUBCASE("dtype mismatch") {
    Tensor vh = Tensor::zeros(*e, s, cpu, DType::bfloat16);
    const std::string m = message([&] { ops::causal_attention(q, kt, vh, 0.5f); });
    CHECK(m.find("causal_attention") != std::string::npos);
    CHECK(m.find("bfloat16") != std::string::npos);
  }
  SUBCASE("scale") {
    const std::string m = message([&] { ops::causal_attention(q, kt, v, std::numeric_limits<float>::infinity()); });
    CHECK(m.find("causal_attention: scale") != std::string::npos);
  }
  SUBCASE("backward lse shape") {
    ops::CausalAttention a = ops::causal_attention(q, kt, v, 0.5f);
    Tensor bad_lse = Tensor::zeros(*e, Shape{1, 2, 4}, cpu).set_name("lse4");
    const std::string m =
        message([&] { ops::causal_attention_backward(q, kt, v, a.out, a.out, bad_lse, 0.5f); });
    CHECK(m.find("causal_attention_backward: lse") != std::string::npos);
    CHECK(m.find("lse4") != std::string::npos);
    CHECK(m.find("[1, 2, 5]") != std::string::npos);
  }
  SUBCASE("backward dout shape") {
    ops::CausalAttention a = ops::causal_attention(q, kt, v, 0.5f);
    Tensor dout = Tensor::zeros(*e, Shape{1, 2, 5, 3}, cpu).set_name("dout3");
    const std::string m = message([&] { ops::causal_attention_backward(q, kt, v, a.out, dout, a.lse, 0.5f); });
    CHECK(m.find("causal_attention_backward: dout") != std::string::npos);
    CHECK(m.find("dout3") != std::string::npos);
  }
}
