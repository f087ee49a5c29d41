// Captured GPU ops replayed as stream graphs (CaptureOptions::gpu_graphs):
// a training step captured once and replayed on new data gives the bits of
// the same steps pushed one by one; the bodies run at the first two replays
// only (warm-up, capture) and the graph is launched after; a segment whose
// capture fails runs op by op, and one whose input failed runs op by op at
// that replay and as a graph again at the next. On CUDA the segments are
// CUDA Graphs; on simulated GPUs the recorded stream items.
#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"
#include "weft/op_graph.h"

using namespace gputest;
namespace ops = weft::ops;

namespace {

struct Net {
  Tensor w1, b1, w2, b2;
};

Net make_net(Engine& e, Device d) {
  return Net{Tensor::normal(e, Shape{32, 64}, 0.0f, 0.2f, 11, d), Tensor::zeros(e, Shape{32}, d),
             Tensor::normal(e, Shape{10, 32}, 0.0f, 0.2f, 12, d), Tensor::zeros(e, Shape{10}, d)};
}

// One step: two dense layers, softmax cross-entropy, backward, SGD in place.
Tensor step(Net& net, const Tensor& x, const Tensor& labels) {
  const Tensor h = ops::dense(x, net.w1, net.b1);
  const Tensor a = ops::relu(h);
  const Tensor logits = ops::dense(a, net.w2, net.b2);
  const ops::SoftmaxCrossEntropy sce = ops::softmax_cross_entropy(logits, labels);
  const ops::DenseGrads g2 = ops::dense_backward(a, net.w2, sce.dlogits);
  const Tensor dh = ops::relu_grad(h, g2.dx);
  const ops::DenseGrads g1 = ops::dense_backward(x, net.w1, dh);
  ops::sgd_update(net.w1, g1.dw, 0.05f, 1e-4f);
  ops::sgd_update(net.b1, g1.db, 0.05f);
  ops::sgd_update(net.w2, g2.dw, 0.05f, 1e-4f);
  ops::sgd_update(net.b2, g2.db, 0.05f);
  return sce.loss;
}

std::vector<float> batch_of(int i, std::int64_t rows) {
  Rng rng(static_cast<std::uint64_t>(1000 + i));
  std::vector<float> v(static_cast<std::size_t>(rows * 64));
  for (float& f : v) f = rng.uniform(-1.0f, 1.0f);
  return v;
}
std::vector<float> labels_of(int i, std::int64_t rows) {
  std::vector<float> v(static_cast<std::size_t>(rows));
  for (std::size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>((k * 3 + static_cast<std::size_t>(i)) % 10);
  return v;
}

struct GraphRun {
  std::vector<float> losses;
  std::vector<std::vector<float>> params;
};

constexpr std::int64_t kRows = 24;
constexpr int kSteps = 6;

GraphRun pushed(Engine& e, Device d) {
  Net net = make_net(e, d);
  GraphRun r;
  for (int i = 0; i < kSteps; ++i) {
    const Tensor x = Tensor::from_host(e, Shape{kRows, 64}, batch_of(i, kRows), d);
    const Tensor y = Tensor::from_host(e, Shape{kRows}, labels_of(i, kRows), d);
    r.losses.push_back(step(net, x, y).item());
  }
  for (const Tensor* t : {&net.w1, &net.b1, &net.w2, &net.b2}) r.params.push_back(t->to_host());
  return r;
}

GraphRun replayed(Engine& e, Device d, std::size_t* segments) {
  Net net = make_net(e, d);
  Tensor x = Tensor::empty(e, Shape{kRows, 64}, d), y = Tensor::empty(e, Shape{kRows}, d);
  e.begin_capture({.gpu_graphs = true});
  const Tensor loss = step(net, x, y);
  const weft::OpGraph graph = e.end_capture();
  *segments = graph.gpu_segments();
  GraphRun r;
  for (int i = 0; i < kSteps; ++i) {
    x.copy_from(Tensor::from_host(e, Shape{kRows, 64}, batch_of(i, kRows), d));
    y.copy_from(Tensor::from_host(e, Shape{kRows}, labels_of(i, kRows), d));
    e.replay(graph);
    r.losses.push_back(loss.item());
  }
  for (const Tensor* t : {&net.w1, &net.b1, &net.w2, &net.b2}) r.params.push_back(t->to_host());
  return r;
}

}  // namespace

TEST_CASE("gpu stream graphs - a captured step replayed as stream graphs gives the bits of pushed steps" *
          doctest::timeout(240)) {
  WEFT_REQUIRE_GPU();
  const Device d = Device::gpu(0);
  GraphRun plain;
  {
    auto e = make_engine({.kind = "naive", .gpu_devices = 1});
    plain = pushed(*e, d);
  }
  for (const int streams : {1, 3}) {
    INFO(streams << " compute stream(s)");
    auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = streams});
    std::size_t segments = 0;
    const GraphRun graphs = replayed(*e, d, &segments);
    CHECK(segments >= 1);
    CHECK(graphs.losses == plain.losses);
    CHECK(graphs.params == plain.params);
  }
  {
    INFO("naive engine: gpu_graphs ignored, the same bits");
    auto e = make_engine({.kind = "naive", .gpu_devices = 1});
    std::size_t segments = 0;
    const GraphRun naive = replayed(*e, d, &segments);
    CHECK(segments == 0);
    CHECK(naive.losses == plain.losses);
  }
}

TEST_CASE("gpu stream graphs - bodies run at the warm-up and the capture, launches replay their work" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  const Device d = Device::gpu(0);
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 1});
  constexpr std::size_t kCount = 1000, kBytes = kCount * sizeof(float);
  weft::Allocator& device_memory = e->allocator(d);
  const weft::Block a = device_memory.allocate(kBytes), b = device_memory.allocate(kBytes),
                    c = device_memory.allocate(kBytes);
  const weft::Var va = e->new_var("a"), vb = e->new_var("b"), vc = e->new_var("c"), vout = e->new_var("out");
  std::vector<float> in(kCount), out(kCount);
  std::atomic<int> calls{0};
  // Copies on gpu(0)'s compute stream: `counted` ones count their body's calls.
  auto copy = [&](void* dst, const void* src, weft::gpu::CopyKind kind, weft::Var from, weft::Var to, const char* name,
                  bool counted) {
    e->push(
        [&calls, dst, src, kind, counted](weft::RunContext& ctx) {
          if (counted) calls.fetch_add(1);
          weft::gpu::memcpy_async(dst, src, kBytes, kind, ctx.gpu->stream);
        },
        d, {from}, {to}, {.name = name});
  };
  e->begin_capture({.gpu_graphs = true});
  copy(b.ptr, a.ptr, weft::gpu::CopyKind::device_to_device, va, vb, "a to b", true);
  copy(c.ptr, b.ptr, weft::gpu::CopyKind::device_to_device, vb, vc, "b to c", true);
  const weft::OpGraph graph = e->end_capture();
  REQUIRE(graph.gpu_segments() == 1);
  CHECK(graph.gpu_segment_ops() == 2);
  for (int r = 1; r <= 5; ++r) {
    std::fill(in.begin(), in.end(), static_cast<float>(r));
    copy(a.ptr, in.data(), weft::gpu::CopyKind::host_to_device, vout, va, "in", false);
    e->replay(graph);
    copy(out.data(), c.ptr, weft::gpu::CopyKind::device_to_host, vc, vout, "out", false);
    e->wait_to_read(vout);
    CHECK(out.front() == static_cast<float>(r));
    CHECK(out.back() == static_cast<float>(r));
  }
  e->wait_all();
  CHECK(calls.load() == 4);  // 2 ops x (warm-up + capture); launches call no body
  for (const weft::Block& block : {a, b, c}) device_memory.free(block);
}

TEST_CASE("gpu stream graphs - a segment whose capture fails runs op by op, each replay once" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  const Device d = Device::gpu(0);
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 1});
  Tensor a = Tensor::zeros(*e, Shape{16}, d), b = Tensor::zeros(*e, Shape{16}, d);
  std::atomic<int> host_calls{0};
  e->begin_capture({.gpu_graphs = true});
  a = ops::add_scalar(a, 1.0f);
  // A host function runs once: a graph cannot hold it, so the capture fails.
  e->push(
      [&](weft::RunContext& ctx) {
        weft::gpu::launch_host_func(ctx.gpu->stream, [&] { host_calls.fetch_add(1); });
      },
      d, {a.var()}, {b.var()}, {.name = "host callback"});
  const Tensor a2 = ops::add_scalar(b, 1.0f);
  const weft::OpGraph graph = e->end_capture();
  REQUIRE(graph.gpu_segments() == 1);
  for (int r = 1; r <= 4; ++r) e->replay(graph);
  e->wait_all();
  CHECK(host_calls.load() == 4);  // once per replay: the failed capture's call enqueued nothing
  CHECK(a2.to_host().front() == 1.0f);
}

TEST_CASE("gpu stream graphs - an input that failed runs the segment op by op, the next replay launches again" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  const Device d = Device::gpu(0);
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 2});
  Tensor src = Tensor::zeros(*e, Shape{64}, Device::cpu(0));
  Tensor x = Tensor::zeros(*e, Shape{64}, d), y = Tensor::zeros(*e, Shape{64}, d);
  std::atomic<int> fail_at{3}, replays{0};
  e->begin_capture({.gpu_graphs = true});
  e->push(
      [&](weft::RunContext&) {
        if (replays.fetch_add(1) + 1 == fail_at.load()) throw std::runtime_error("bad batch");
      },
      Device::cpu(0), {}, {src.var()}, {.name = "load"});
  x.copy_from(src);
  const Tensor x2 = ops::mul(x, x);
  y.copy_from(ops::add_scalar(x2, 1.0f));
  const weft::OpGraph graph = e->end_capture();
  CHECK(graph.gpu_segments() >= 1);
  for (int r = 1; r <= 5; ++r) {
    e->replay(graph);
    if (r == 3) {
      CHECK_THROWS_WITH(e->wait_to_read(y.var()), doctest::Contains("bad batch"));
    } else {
      e->wait_to_read(y.var());
      CHECK(y.to_host().front() == 1.0f);
    }
  }
}

TEST_CASE("gpu stream graphs - a variable deleted after the capture is named with the op of the segment using it" *
          doctest::timeout(60)) {
  WEFT_REQUIRE_GPU();
  const Device d = Device::gpu(0);
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  const Tensor x = Tensor::full(*e, Shape{8}, 2.0f, d);
  const weft::Var extra = e->new_var("extra");
  e->begin_capture({.gpu_graphs = true});
  const Tensor y = ops::add_scalar(x, 1.0f);
  e->push([](weft::RunContext&) {}, d, {y.var()}, {extra}, {.name = "uses extra"});
  const Tensor z = ops::mul(y, y);
  const weft::OpGraph graph = e->end_capture();
  REQUIRE(graph.gpu_segments() == 1);
  CHECK(graph.ops() == 3);
  e->replay(graph);
  CHECK(z.to_host().front() == 9.0f);
  e->delete_var(extra);
  CHECK_THROWS_WITH_AS(e->replay(graph), doctest::Contains("used by captured op 'uses extra', #1 of 3"),
                       weft::InvalidArgument);
}

TEST_CASE("gpu stream graphs - a body that records an event, waits on the host or allocates makes its capture fail" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  const Device d = Device::gpu(0);
  for (const std::string what : {"records an event", "waits for its device", "allocates device memory"}) {
    INFO("a body that " << what);
    auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 1});
    Tensor x = Tensor::full(*e, Shape{16}, 1.0f, d);
    const weft::Var side = e->new_var("side");
    std::atomic<int> calls{0};
    e->begin_capture({.gpu_graphs = true});
    const Tensor y = ops::add_scalar(x, 1.0f);
    e->push(
        [&, what, d](weft::RunContext& ctx) {
          calls.fetch_add(1);
          if (what == "records an event") {
            weft::gpu::Event::record(0, ctx.gpu->stream)->release();
          } else if (what == "waits for its device") {
            weft::gpu::synchronize_device(0);
          } else {
            weft::Allocator& memory = e->allocator(d);
            memory.free(memory.allocate(4096, ctx.gpu->stream));
          }
        },
        d, {y.var()}, {side}, {.name = "body that " + what});
    const Tensor z = ops::mul_scalar(y, 3.0f);
    const weft::OpGraph graph = e->end_capture();
    REQUIRE(graph.gpu_segments() == 1);
    for (int r = 0; r < 4; ++r) e->replay(graph);
    CHECK(z.to_host().front() == 6.0f);
    e->wait_all();
    // Warm-up, the refused call at the capture, then op by op: once more each.
    CHECK(calls.load() == 5);
  }
}

TEST_CASE("gpu stream graphs - another thread freeing memory the capturing stream used keeps it cached" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  const Device d = Device::gpu(0);
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 1});
  // `used` comes from a copy stream and is read on the compute stream: its
  // free records an event on the compute stream — from this thread, while
  // the worker captures that stream below.
  std::optional<Tensor> used = Tensor::from_host(*e, Shape{1 << 14}, std::vector<float>(1 << 14, 2.0f), d);
  const Tensor doubled = ops::mul_scalar(*used, 2.0f);
  CHECK(doubled.to_host().front() == 4.0f);
  e->wait_all();
  Tensor x = Tensor::full(*e, Shape{8}, 1.0f, d);
  const weft::Var side = e->new_var("side");
  std::atomic<int> calls{0};
  std::atomic<bool> capturing{false}, freed{false};
  e->begin_capture({.gpu_graphs = true});
  const Tensor y = ops::add_scalar(x, 1.0f);
  e->push(
      [&](weft::RunContext&) {
        if (calls.fetch_add(1) + 1 != 2) return;  // the capture is the second call
        capturing.store(true);
        while (!freed.load()) std::this_thread::yield();
      },
      d, {y.var()}, {side}, {.name = "holds the capture open"});
  const Tensor z = ops::mul_scalar(y, 3.0f);
  const weft::OpGraph graph = e->end_capture();
  REQUIRE(graph.gpu_segments() == 1);
  e->replay(graph);
  e->replay(graph);  // captured: the body waits for `freed`
  while (!capturing.load()) std::this_thread::yield();
  const std::size_t reserved = e->allocator(d).stats().reserved;
  used.reset();  // the last reference: the allocator records an event on the capturing stream
  CHECK(e->allocator(d).stats().reserved == reserved);  // kept, waiting for that event: not lost
  freed.store(true);
  e->replay(graph);
  CHECK(z.to_host().front() == 6.0f);
  e->wait_all();
  CHECK(calls.load() == 2);
}
