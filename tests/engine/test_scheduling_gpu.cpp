// Engine kinds with a GPU, and a small network end to end: the naive engine
// (one stream, drained after each op) and the threaded engine (streams,
// events, copy workers) give the same bits for one program; a LeNet-sized
// forward/backward/SGD step on gpu(0) equals the one on cpu(0).
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gpu_test_util.h"

using namespace gputest;
namespace ops = weft::ops;

TEST_CASE("gpu engines - naive and threaded give identical results" * doctest::timeout(240)) {
  WEFT_REQUIRE_GPU();
  const ProgramOptions opt{.side = 48, .slots = 12, .noise_every = 0, .noise_side = 0};
  const std::vector<Instr> program = make_program(500, 4242, opt.slots);
  ProgramResult naive, threaded, reference;
  {
    auto e = make_engine({.kind = "naive", .gpu_devices = 1});
    CHECK(e->kind() == "naive");
    naive = run_program(*e, program, Device::gpu(0), Device::cpu(0), opt);
  }
  {
    auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 4});
    ProgramOptions noisy = opt;
    noisy.noise_every = 20;  // streams out of step: results must not depend on it
    noisy.noise_side = 1024;
    threaded = run_program(*e, program, Device::gpu(0), Device::cpu(0), noisy);
  }
  {
    auto e = make_engine({.kind = "threaded", .cpu_devices = 2, .gpu_devices = 0});
    reference = run_program(*e, program, Device::cpu(1), Device::cpu(0), opt);
  }
  // The same kernels on the same data in the same dependency order: the
  // same bits (the GPU kernels are deterministic by design, cuDNN/cuBLAS
  // choices do not depend on the stream).
  const std::size_t bits = compare_runs(threaded, naive, 0, 0, "threaded vs naive on gpu(0)");
  CHECK(bits == 0);
  compare_runs(naive, reference, 1e-4, 1e-4, "naive gpu(0) vs cpu reference");
}

TEST_CASE("gpu engines - ops pushed in bulks give the bits of ops pushed one by one" * doctest::timeout(240)) {
  WEFT_REQUIRE_GPU();
  // GPU ops, copies both ways (another property: they flush) and host ops,
  // on one GPU and on two: bulks of GPU ops run on one stream, with one
  // stream wait for their inputs and one event for their outputs.
  const ProgramOptions opt{.side = 32, .slots = 10, .noise_every = 0, .noise_side = 0};
  const std::vector<Instr> program = make_program(400, 5151, opt.slots);
  for (const int gpus : {1, 2}) {
    if (weft::gpu::device_count() < gpus) break;
    std::vector<Device> devs;
    for (int g = 0; g < gpus; ++g) devs.push_back(Device::gpu(g));
    ProgramResult plain;
    {
      auto e = make_engine({.kind = "naive", .gpu_devices = gpus});
      plain = run_program(*e, program, devs, Device::cpu(0), opt);
    }
    for (const std::size_t size : {std::size_t{4}, std::size_t{32}}) {
      INFO(gpus << " GPU(s), bulks of " << size);
      auto e = make_engine({.kind = "threaded", .gpu_devices = gpus, .compute_streams_per_gpu = 3});
      ProgramResult bulked;
      {
        weft::BulkScope bulk(*e, size);
        bulked = run_program(*e, program, devs, Device::cpu(0), opt);
      }
      CHECK(compare_runs(bulked, plain, 0, 0, "bulked threaded vs naive") == 0);
    }
  }
}

namespace {

struct LeNet {
  Tensor w1, b1, w2, b2, w3, b3;
};

struct StepLog {
  std::vector<float> losses;
  std::vector<std::vector<float>> first_grads;  // dw1 db1 dw2 db2 dw3 db3 of the first step
  std::vector<std::vector<float>> first_activations;
  std::vector<std::vector<float>> params;       // after the last step
};

StepLog train(Engine& e, Device d, int steps) {
  const std::int64_t batch = 16;
  LeNet net{Tensor::normal(e, Shape{6, 1, 5, 5}, 0.0f, 0.2f, 1, d),   Tensor::zeros(e, Shape{6}, d),
            Tensor::normal(e, Shape{16, 6, 5, 5}, 0.0f, 0.08f, 2, d), Tensor::full(e, Shape{16}, 0.01f, d),
            Tensor::normal(e, Shape{10, 400}, 0.0f, 0.05f, 3, d),     Tensor::zeros(e, Shape{10}, d)};
  const ops::Conv2dParams pad2{1, 2}, nopad{1, 0};
  const ops::Pool2dParams pool{2, 2};
  StepLog log;
  for (int step = 0; step < steps; ++step) {
    const Tensor x = Tensor::uniform(e, Shape{batch, 1, 28, 28}, 0.0f, 1.0f, 100 + static_cast<std::uint64_t>(step), d);
    std::vector<float> label_values(static_cast<std::size_t>(batch));
    for (std::size_t i = 0; i < label_values.size(); ++i) label_values[i] = static_cast<float>((i * 7 + step) % 10);
    const Tensor labels = Tensor::from_host(e, Shape{batch}, label_values, d);
    // Forward.
    const Tensor c1 = ops::conv2d(x, net.w1, net.b1, pad2);  // [16, 6, 28, 28]
    const Tensor a1 = ops::relu(c1);
    const Tensor p1 = ops::avg_pool2d(a1, pool);  // [16, 6, 14, 14]
    const Tensor c2 = ops::conv2d(p1, net.w2, net.b2, nopad);  // [16, 16, 10, 10]
    const Tensor a2 = ops::relu(c2);
    const Tensor p2 = ops::max_pool2d(a2, pool);  // [16, 16, 5, 5]
    const Tensor flat = p2.reshape(Shape{batch, 400});
    const Tensor logits = ops::dense(flat, net.w3, net.b3);
    const ops::SoftmaxCrossEntropy loss = ops::softmax_cross_entropy(logits, labels);
    // Backward.
    const ops::DenseGrads g3 = ops::dense_backward(flat, net.w3, loss.dlogits);
    const Tensor dp2 = g3.dx.reshape(p2.shape());
    const Tensor da2 = ops::max_pool2d_backward(a2, dp2, pool);
    const Tensor dc2 = ops::relu_grad(c2, da2);
    const ops::ConvFilterGrads g2 = ops::conv2d_backward_filter(p1, dc2, net.w2.shape(), nopad);
    const Tensor dp1 = ops::conv2d_backward_data(dc2, net.w2, p1.shape(), nopad);
    const Tensor da1 = ops::avg_pool2d_backward(dp1, a1.shape(), pool);
    const Tensor dc1 = ops::relu_grad(c1, da1);
    const ops::ConvFilterGrads g1 = ops::conv2d_backward_filter(x, dc1, net.w1.shape(), pad2);
    if (step == 0) {
      for (const Tensor* t : {&g1.dw, &g1.db, &g2.dw, &g2.db, &g3.dw, &g3.db}) log.first_grads.push_back(t->to_host());
      for (const Tensor* t : {&c1, &p1, &c2, &p2, &logits, &loss.dlogits}) log.first_activations.push_back(t->to_host());
    }
    // SGD, in place (the next step's forward reads the updated weights).
    const float lr = 0.1f;
    ops::sgd_update(net.w1, g1.dw, lr, 1e-4f);
    ops::sgd_update(net.b1, g1.db, lr);
    ops::sgd_update(net.w2, g2.dw, lr, 1e-4f);
    ops::sgd_update(net.b2, g2.db, lr);
    ops::sgd_update(net.w3, g3.dw, lr, 1e-4f);
    ops::sgd_update(net.b3, g3.db, lr);
    log.losses.push_back(loss.loss.item());
  }
  for (const Tensor* t : {&net.w1, &net.b1, &net.w2, &net.b2, &net.w3, &net.b3}) {
    CHECK(t->device() == d);
    log.params.push_back(t->to_host());
  }
  e.wait_all();
  return log;
}

}  // namespace

TEST_CASE("gpu engines - lenet step on gpu equals cpu" * doctest::timeout(240)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  const int steps = 3;
  const StepLog cpu = train(*e, Device::cpu(0), steps);
  const StepLog gpu = train(*e, Device::gpu(0), steps);
  REQUIRE(gpu.losses.size() == static_cast<std::size_t>(steps));
  MESSAGE("losses cpu " << cpu.losses[0] << " " << cpu.losses[1] << " " << cpu.losses[2] << ", gpu " << gpu.losses[0]
                        << " " << gpu.losses[1] << " " << gpu.losses[2]);
  for (int s = 0; s < steps; ++s) {
    CHECK(std::isfinite(gpu.losses[static_cast<std::size_t>(s)]));
    CHECK(gpu.losses[static_cast<std::size_t>(s)] ==
          doctest::Approx(cpu.losses[static_cast<std::size_t>(s)]).epsilon(s == 0 ? 1e-5 : 1e-4));
  }
  const char* grad_names[] = {"dw1", "db1", "dw2", "db2", "dw3", "db3"};
  const char* act_names[] = {"conv1", "pool1", "conv2", "pool2", "logits", "dlogits"};
  const char* param_names[] = {"w1", "b1", "w2", "b2", "w3", "b3"};
  for (std::size_t i = 0; i < 6; ++i) {
    expect_close_scaled(gpu.first_activations[i], cpu.first_activations[i], 1e-3,
                        std::string("step 0 ") + act_names[i]);
    expect_close_scaled(gpu.first_grads[i], cpu.first_grads[i], 1e-3, std::string("step 0 ") + grad_names[i]);
    expect_close_scaled(gpu.params[i], cpu.params[i], 1e-3, std::string("after training ") + param_names[i]);
  }
  // Training did something: the weights moved.
  const StepLog none = train(*e, Device::cpu(0), 0);
  double moved = 0;
  for (std::size_t i = 0; i < 6; ++i)
    for (std::size_t k = 0; k < gpu.params[i].size(); ++k)
      moved = std::max(moved, std::fabs(static_cast<double>(gpu.params[i][k]) - none.params[i][k]));
  CHECK(moved > 1e-4);
}

// A GPU pool's worker only enqueues work on its stream, which runs it in the
// order given; so among ready ops of one priority it must take the one pushed
// first, even when a later-pushed one became ready earlier (in ready order a
// chain of copies of one result queues behind the next result's first copy,
// and the copy stream waits for the next kernel: docs/design/engine-invariants.md).
TEST_CASE("gpu engines - a gpu pool takes ready ops in push order, not ready order" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .cpu_devices = 1, .gpu_devices = 1});
  const Device gpu = Device::gpu(0);
  std::mutex m;
  std::condition_variable cv;
  bool pool_open = false, cpu_open = false;
  std::vector<std::string> order;
  auto hold = [&](bool& open) {
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return open; });
  };
  auto record = [&](const char* label) {
    return [&, label](weft::RunContext&) {
      std::lock_guard lock(m);
      order.emplace_back(label);
    };
  };
  const weft::OpOptions d2h{.property = weft::OpProperty::copy_from_device};
  // The device-to-host pool's one worker is held; x's writer on cpu(0) too.
  e->push([&](weft::RunContext&) { hold(pool_open); }, gpu, {}, {e->new_var("held")}, d2h);
  const weft::Var x = e->new_var("x");
  e->push([&](weft::RunContext&) { hold(cpu_open); }, Device::cpu(0), {}, {x});
  e->push(record("pushed first"), gpu, {x}, {e->new_var("a")}, d2h);   // ready once x is written
  e->push(record("pushed second"), gpu, {}, {e->new_var("b")}, d2h);  // ready at once
  {
    std::lock_guard lock(m);
    cpu_open = true;
  }
  cv.notify_all();
  e->wait_to_read(x);  // "pushed first" is granted x in the same completion
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // and queued on the pool
  {
    std::lock_guard lock(m);
    pool_open = true;
  }
  cv.notify_all();
  e->wait_all();
  CHECK(order == std::vector<std::string>{"pushed first", "pushed second"});
}

// A GPU op writing `var` that completes (in the engine's sense) once
// enqueued; its stream then holds until open() is called.
struct HeldStream {
  std::atomic<bool> is_open{false};
  std::atomic<bool> holding{false};
  void push(Engine& e, Device gpu, weft::Var var) {
    e.push(
        [this](weft::RunContext& ctx) {
          weft::gpu::launch_host_func(ctx.gpu->stream, [this] {
            holding = true;
            while (!is_open.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
          });
        },
        gpu, {}, {var}, {.name = "held on the stream"});
  }
  void open() { is_open = true; }
};

// OpOptions::run_inline: a CPU op that would have to wait on the host for
// unfinished GPU work never runs on the thread that made it ready (which
// must not block); it takes a worker. Once the work is done it runs inline.
TEST_CASE("gpu engines - an inline op waits for unfinished GPU work on a worker, not inline" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 1, .gpu_devices = 1});
  const Device gpu = Device::gpu(0);
  const weft::Var g = e->new_var("g");
  HeldStream held;
  held.push(*e, gpu, g);
  // The reader is pushed once the GPU op has left the engine (its finish,
  // which releases g, comes before it stops counting as in flight) and its
  // stream is held, so the reader is ready at push, on this thread, with its
  // input's GPU work certainly unfinished. (Opening the stream right after an
  // earlier push let a slow, sanitized run finish the stream first.)
  while (e->inflight() != 0 || !held.holding.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<int> worker{-2};
  auto inline_reader = [&](weft::RunContext& ctx, weft::Completion done) {
    worker = ctx.worker;
    done();
  };
  e->push_async(inline_reader, Device::cpu(0), {g}, {}, {.name = "inline reader", .run_inline = true});
  held.open();
  e->wait_all();
  CHECK(worker.load() >= 0);  // on the worker, which waited for the stream

  e->push([](weft::RunContext&) {}, gpu, {}, {g}, {.name = "quick"});
  e->wait_to_read(g);  // the GPU work is done
  e->push_async(inline_reader, Device::cpu(0), {g}, {}, {.name = "inline reader", .run_inline = true});
  e->wait_all();
  CHECK(worker.load() == -1);  // inline, on this thread
}

// OpOptions::defer_gpu_waits: an async CPU op holding a GPU-written variable
// runs while that GPU work is still unfinished, and is handed its event
// (ctx.gpu_waits) instead of waiting for it; a written variable's GPU
// readers come with it; a GPU op given those events (after_gpu_work) runs
// its work after that work. Without the option ctx.gpu_waits is null; push()
// refuses it, and after_gpu_work on CPU ops.
TEST_CASE("gpu engines - a defer_gpu_waits op is handed its inputs' GPU events instead of waiting" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 1, .gpu_devices = 1});
  const Device gpu = Device::gpu(0);
  const weft::Var g = e->new_var("g");
  HeldStream held;
  held.push(*e, gpu, g);
  while (!held.holding.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::atomic<bool> ran{false};
  std::atomic<bool> ran_while_held{false};
  std::atomic<int> events{-1}, unfinished{-1};
  std::vector<weft::gpu::EventRef> kept;
  e->push_async(
      [&](weft::RunContext& ctx, weft::Completion done) {
        ran_while_held = !held.is_open.load();
        if (ctx.gpu_waits) {
          kept = *ctx.gpu_waits;
          events = static_cast<int>(kept.size());
          int n = 0;
          for (const weft::gpu::EventRef& ev : kept) n += ev->done() ? 0 : 1;
          unfinished = n;
        }
        ran = true;
        done();
      },
      Device::cpu(0), {g}, {}, {.name = "deferred reader", .defer_gpu_waits = true});
  // Give it time to run while the stream is held; a waiting op would not.
  for (int i = 0; i < 5000 && !ran.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  CHECK(ran_while_held.load());
  // A GPU op on another stream given those events (OpOptions::after_gpu_work)
  // runs its work only after the held one.
  std::atomic<bool> after_ran{false}, after_saw_open{false};
  e->push(
      [&](weft::RunContext& ctx) {
        weft::gpu::launch_host_func(ctx.gpu->stream, [&] {
          after_saw_open = held.is_open.load();
          after_ran = true;
        });
      },
      gpu, {}, {e->new_var("after")},
      {.name = "after the held work", .property = weft::OpProperty::copy_from_device, .after_gpu_work = kept});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK_FALSE(after_ran.load());
  held.open();
  e->wait_all();
  CHECK(after_saw_open.load());
  CHECK(events.load() == 1);      // g's writer
  CHECK(unfinished.load() == 1);  // still held when handed over

  // Writing: the GPU readers since the last write come too.
  e->push([](weft::RunContext&) {}, gpu, {g}, {e->new_var("r")}, {.name = "gpu reader"});
  std::atomic<int> write_events{-1};
  e->push_async(
      [&](weft::RunContext& ctx, weft::Completion done) {
        write_events = ctx.gpu_waits ? static_cast<int>(ctx.gpu_waits->size()) : -1;
        done();
      },
      Device::cpu(0), {}, {g}, {.name = "deferred writer", .defer_gpu_waits = true});
  e->wait_all();
  CHECK(write_events.load() == 2);  // the writer and the reader
  // The deferred writer settled g's GPU history: the next one is handed nothing.
  std::atomic<bool> null_waits{false};
  e->push_async(
      [&](weft::RunContext& ctx, weft::Completion done) {
        null_waits = ctx.gpu_waits == nullptr;
        done();
      },
      Device::cpu(0), {g}, {}, {.name = "plain reader"});
  std::atomic<int> after_write = -1;
  e->push_async(
      [&](weft::RunContext& ctx, weft::Completion done) {
        after_write = ctx.gpu_waits ? static_cast<int>(ctx.gpu_waits->size()) : -1;
        done();
      },
      Device::cpu(0), {g}, {}, {.name = "deferred reader after", .defer_gpu_waits = true});
  e->wait_all();
  CHECK(null_waits.load());
  CHECK(after_write.load() == 0);
  CHECK_THROWS_AS(e->push([](weft::RunContext&) {}, Device::cpu(0), {}, {}, {.defer_gpu_waits = true}),
                  weft::InvalidArgument);
  // after_gpu_work is for GPU ops.
  CHECK_THROWS_AS(e->push([](weft::RunContext&) {}, Device::cpu(0), {}, {}, {.after_gpu_work = kept}),
                  weft::InvalidArgument);
  CHECK_THROWS_AS(e->push_async([](weft::RunContext&, weft::Completion done) { done(); }, Device::cpu(0), {}, {},
                                {.after_gpu_work = kept}),
                  weft::InvalidArgument);
}
