// Channels-last memory format on CPU devices: the conversion op and what it
// stores, NHWC against NCHW for convolutions (forward, both backward
// halves), pooling, batch norm and the elementwise family in float32,
// bfloat16 and float16, layout errors, checkpoints of channels_last tensors,
// and a ResNet-18 training step channels_last against NCHW. Each case runs
// on the naive engine and on the threaded one at test_workers.h's counts.
#include <doctest/doctest.h>

#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include "ops/memory_format_util.h"
#include "storage.h"
#include "test_workers.h"
#include "weft/checkpoint.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/nn.h"

using namespace weft_nhwc;
using weft::Engine;
using weft::EngineConfig;
namespace nn = weft::nn;

namespace {

// fn(engine) on a naive engine and on threaded ones at each worker count.
template <class F>
void for_engines_at_worker_counts(F&& fn) {
  std::vector<std::pair<std::string, int>> runs{{"naive", 1}};
  for (int w : weft_test::worker_counts()) runs.emplace_back("threaded", w);
  for (const auto& [kind, workers] : runs) {
    INFO("engine " << kind << ", " << workers << " worker(s)");
    EngineConfig c;
    c.kind = kind;
    c.cpu_devices = 1;
    c.workers_per_cpu_device = workers;
    auto e = Engine::create(c);
    fn(*e);
    e->wait_all();
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const weft::Error& e) {
    return e.what();
  }
  return "(no error)";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const DType kDtypes[] = {DType::float32, DType::bfloat16, DType::float16};

}  // namespace

TEST_CASE("memory format: to_channels_last stores NHWC, to_host reads NCHW order, to_contiguous restores" *
          doctest::timeout(60)) {
  for_engines_at_worker_counts([](Engine& e) {
    for (DType t : kDtypes) {
      INFO(weft::to_string(t));
      const std::int64_t n = 2, c = 3, h = 4, w = 5;
      std::vector<float> v(static_cast<std::size_t>(n * c * h * w));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i);  // exact in every dtype here
      const Tensor x = Tensor::from_host(e, Shape{n, c, h, w}, v, {}, t);
      CHECK(x.memory_format() == MemoryFormat::contiguous);
      const Tensor y = channels_last(x);
      CHECK(y.memory_format() == MemoryFormat::channels_last);
      CHECK(y.shape() == x.shape());
      CHECK(y.dtype() == t);
          const bool same_storage = ops::to_memory_format(y, MemoryFormat::channels_last).storage() == y.storage();
      CHECK(same_storage);  // no op: itself
      check_bitwise(y.to_host(), v, "to_host of channels_last");
      // What memory holds: element (n, c, h, w) at ((n * H + h) * W + w) * C + c.
      const Tensor yf = ops::cast(y, DType::float32);
      CHECK(yf.memory_format() == MemoryFormat::channels_last);
      yf.wait_to_read();
      const auto* raw = static_cast<const float*>(yf.storage()->data());
      bool nhwc = true;
      for (std::int64_t i = 0; i < n; ++i)
        for (std::int64_t k = 0; k < c; ++k)
          for (std::int64_t r = 0; r < h; ++r)
            for (std::int64_t s = 0; s < w; ++s)
              nhwc = nhwc && raw[((i * h + r) * w + s) * c + k] == v[static_cast<std::size_t>(((i * c + k) * h + r) * w + s)];
      CHECK(nhwc);
      const Tensor back = ops::contiguous(y);
      CHECK(back.memory_format() == MemoryFormat::contiguous);
      check_bitwise(back.to_host(), v, "to_contiguous");
      // A copy keeps the format, and copy_from between like formats works.
      const Tensor copy = y.copy_to(Device::cpu(0));
      CHECK(copy.memory_format() == MemoryFormat::channels_last);
      check_bitwise(copy.to_host(), v, "copy_to");
    }
  });
}

TEST_CASE("memory format: conv2d forward and both backward halves in NHWC equal NCHW" * doctest::timeout(180)) {
  for_engines_at_worker_counts([](Engine& e) {
    for (DType t : kDtypes)
      for (const ConvCase& k : conv_cases()) check_conv_case(e, Device::cpu(0), t, k, rounding_of(t));
  });
}

TEST_CASE("memory format: pooling and batch norm in NHWC give NCHW's bits" * doctest::timeout(120)) {
  for_engines_at_worker_counts([](Engine& e) {
    for (DType t : kDtypes) check_pool_and_norm(e, Device::cpu(0), t, true, 0.0);
  });
}

TEST_CASE("memory format: elementwise ops keep the format, a mixed pair takes the first operand's" *
          doctest::timeout(60)) {
  for_engines_at_worker_counts([](Engine& e) {
    for (DType t : kDtypes) {
      INFO(weft::to_string(t));
      const Shape s{2, 3, 4, 5};
      const Tensor a = Tensor::from_host(e, s, host_values(s.numel(), 31), {}, t);
      const Tensor b = Tensor::from_host(e, s, host_values(s.numel(), 32), {}, t);
      const Tensor al = channels_last(a), bl = channels_last(b);
      const auto same = [](const Tensor& got, MemoryFormat f, const Tensor& want, const char* what) {
        CHECK_MESSAGE(got.memory_format() == f, what);
        check_bitwise(got.to_host(), want.to_host(), what);
      };
      const MemoryFormat last = MemoryFormat::channels_last, cont = MemoryFormat::contiguous;
      same(ops::add(al, bl), last, ops::add(a, b), "add");
      same(ops::add(al, b), last, ops::add(a, b), "add, b contiguous");
      same(ops::add(a, bl), cont, ops::add(a, b), "add, a contiguous");
      same(ops::sub(al, bl), last, ops::sub(a, b), "sub");
      same(ops::mul(al, b), last, ops::mul(a, b), "mul");
      same(ops::relu(al), last, ops::relu(a), "relu");
      same(ops::relu_grad(al, b), last, ops::relu_grad(a, b), "relu_grad");
      same(ops::add_scalar(al, 0.5f), last, ops::add_scalar(a, 0.5f), "add_scalar");
      same(ops::mul_scalar(al, 3.0f), last, ops::mul_scalar(a, 3.0f), "mul_scalar");
      same(ops::cast(al, DType::float32), last, ops::cast(a, DType::float32), "cast");
      const Tensor f = Tensor::full(e, Shape{1}, 0.25f);
      same(ops::scale_by(al, f), last, ops::scale_by(a, f), "scale_by");
      same(ops::slice_rows(al, 1, 2), last, ops::slice_rows(a, 1, 2), "slice_rows");
      Tensor y0 = ops::mul_scalar(a, 1.0f), y1 = ops::mul_scalar(al, 1.0f);
      ops::axpy(0.5f, b, y0);
      ops::axpy(0.5f, b, y1);  // x contiguous, y channels_last: x converted
      same(y1, last, y0, "axpy");
      CHECK(ops::sum(al).item() == ops::sum(a).item());
      CHECK(ops::mean(al).item() == ops::mean(a).item());
    }
  });
}

TEST_CASE("memory format: layout errors name the op, the tensor and the layout" * doctest::timeout(60)) {
  auto e = Engine::create(EngineConfig{.kind = "naive", .cpu_devices = 1});
  const Tensor a = channels_last(Tensor::from_host(*e, Shape{2, 3, 4, 5}, host_values(120, 41)));
  Tensor act = a;
  act.set_name("act");
  CHECK(has(error_of([&] { (void)act.reshape(Shape{2, 60}); }),
            "reshape: 'act' [2, 3, 4, 5] channels_last is channels_last (NHWC in memory) and cannot become [2, 60]"));
  CHECK(has(error_of([&] { (void)act.view(0, Shape{60}); }), "view: 'act' [2, 3, 4, 5] channels_last is channels_last"));
  Tensor flat = Tensor::zeros(*e, Shape{2, 3});
  flat.set_name("flat");
  CHECK(has(error_of([&] { (void)channels_last(flat); }),
            "to_channels_last: x 'flat' [2, 3] is not 4-D; only [N, C, H, W] tensors can be channels_last"));
  Tensor bucket = Tensor::zeros(*e, Shape{120});
  CHECK(has(error_of([&] { ops::pack({act}, bucket); }),
            "pack: src 0 'act' [2, 3, 4, 5] channels_last is channels_last, which this op cannot take"));
  CHECK(has(error_of([&] { ops::unpack(bucket, {act}); }), "unpack: dst 0 'act' [2, 3, 4, 5] channels_last"));
  Tensor plain = Tensor::zeros(*e, Shape{2, 3, 4, 5});
  CHECK(has(error_of([&] { plain.copy_from(act); }),
            "copy_from: source 'act' [2, 3, 4, 5] channels_last is channels_last but destination [2, 3, 4, 5] is "
            "contiguous"));
  Tensor w = Tensor::zeros(*e, Shape{2, 3, 4, 5});
  CHECK(has(error_of([&] { ops::sgd_update(w, act, 0.1f); }),
            "sgd_update: grad 'act' [2, 3, 4, 5] channels_last is channels_last but w [2, 3, 4, 5] is contiguous"));
  // Where NHWC and NCHW order the values alike, a reshape reinterprets nothing.
  const Tensor pooled = ops::global_avg_pool2d(a);
  CHECK(pooled.memory_format() == MemoryFormat::channels_last);
  const Tensor rows = pooled.reshape(Shape{2, 3});
  CHECK(rows.memory_format() == MemoryFormat::contiguous);
  check_bitwise(rows.to_host(), pooled.to_host(), "reshape of [N, C, 1, 1]");
  // A model on 2-D inputs refuses channels_last.
  nn::Sequential mlp;
  mlp.emplace<nn::Dense>(*e, 8, 4);
  (void)mlp.forward(Tensor::zeros(*e, Shape{5, 8}));
  CHECK(has(error_of([&] { mlp.set_memory_format(MemoryFormat::channels_last); }),
            "Sequential::set_memory_format: the model takes [N, 8] inputs (rank 2); channels_last needs 4-D"));
  e->wait_all();
}

TEST_CASE("memory format: a channels_last tensor is saved in NCHW order and loads into either format" *
          doctest::timeout(60)) {
  namespace ckpt = weft::checkpoint;
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("weft-nhwc-ckpt-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  for (DType t : {DType::float32, DType::bfloat16}) {
    INFO(weft::to_string(t));
    auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 1});
    const Shape s{2, 3, 4, 5};
    const std::vector<float> v = host_values(s.numel(), 51);
    const Tensor nchw = Tensor::from_host(*e, s, v, {}, t);
    const Tensor w = channels_last(nchw);
    const std::filesystem::path at = dir / std::string(weft::to_string(t));
    ckpt::save(*e, at, {ckpt::Entry{.name = "conv.weight", .tensor = w}}).wait();
    const ckpt::Reader reader = ckpt::Reader::open(at);
    CHECK(reader.shape("conv.weight") == s);
    // The file's bytes are the NCHW tensor's bytes.
    const std::vector<std::byte> bytes = reader.read("conv.weight");
    ckpt::save(*e, dir / "ref", {ckpt::Entry{.name = "conv.weight", .tensor = nchw}}).wait();
    CHECK(bytes == ckpt::Reader::open(dir / "ref").read("conv.weight"));
    std::filesystem::remove_all(dir / "ref");
    Tensor into_last = channels_last(Tensor::zeros(*e, s, {}, t));
    Tensor into_plain = Tensor::zeros(*e, s, {}, t);
    ckpt::load(reader, {ckpt::Entry{.name = "conv.weight", .tensor = into_last},
                        ckpt::Entry{.name = "conv.weight", .tensor = into_plain}});
    CHECK(into_last.memory_format() == MemoryFormat::channels_last);
    check_bitwise(into_last.to_host(), nchw.to_host(), "loaded into channels_last");
    check_bitwise(into_plain.to_host(), nchw.to_host(), "loaded into contiguous");
    e->wait_all();
  }
  std::filesystem::remove_all(dir);
}

namespace {

struct StepResult {
  std::vector<float> losses;
  std::vector<std::vector<float>> initial, params, buffers;
};

// Two SGD steps of a small ResNet-18 (3 channels, 12x10 images, the small
// stem) on one batch, then an evaluation-mode loss.
StepResult resnet_steps(Engine& e, MemoryFormat format, weft::Precision precision) {
  auto net = nn::resnet18(e, Device{}, 5, nn::ResNetOptions{.in_channels = 3, .classes = 4});
  net->set_precision(precision);
  const Tensor x = Tensor::from_host(e, Shape{4, 3, 32, 32}, host_values(4 * 3 * 32 * 32, 61, 0.0f, 1.0f));
  const Tensor y = Tensor::from_host(e, Shape{4}, std::vector<float>{1, 3, 0, 2});
  net->set_memory_format(format);
  StepResult r;
  for (nn::Parameter* p : net->parameters()) r.initial.push_back(p->value.to_host());
  for (int s = 0; s < 2; ++s) {
    const ops::SoftmaxCrossEntropy sce = ops::softmax_cross_entropy(ops::cast(net->forward(x), DType::float32), y);
    net->backward(sce.dlogits);
    nn::sgd_step(net->parameters(), 0.01f);
    r.losses.push_back(sce.loss.item());
  }
  net->train(false);
  r.losses.push_back(ops::softmax_cross_entropy(ops::cast(net->forward(x), DType::float32), y).loss.item());
  for (nn::Parameter* p : net->parameters()) {
    CHECK(p->value.memory_format() == MemoryFormat::contiguous);
    r.params.push_back(p->value.to_host());
  }
  for (nn::Buffer* b : net->buffers()) r.buffers.push_back(b->value.to_host());
  return r;
}

}  // namespace

TEST_CASE("memory format: a ResNet-18 training step channels_last equals NCHW" * doctest::timeout(300)) {
  for (weft::Precision precision : {weft::Precision::fp32, weft::Precision::bf16}) {
    const bool fp32 = precision == weft::Precision::fp32;
    const double rtol = fp32 ? 1e-4 : 3e-2;
    INFO("precision " << weft::to_string(precision));
    std::vector<std::pair<std::string, int>> runs{{"naive", 1}, {"threaded", weft_test::worker_counts().back()}};
    for (const auto& [kind, workers] : runs) {
      INFO("engine " << kind << ", " << workers << " worker(s)");
      auto e = Engine::create(EngineConfig{.kind = kind, .cpu_devices = 1, .workers_per_cpu_device = workers});
      const StepResult want = resnet_steps(*e, MemoryFormat::contiguous, precision);
      const StepResult got = resnet_steps(*e, MemoryFormat::channels_last, precision);
      check_near(got.losses, want.losses, rtol, "losses");
      REQUIRE(got.params.size() == want.params.size());
      for (std::size_t i = 0; i < want.params.size(); ++i)
        check_update(got.params[i], want.params[i], want.initial[i], fp32 ? 1e-3 : 3e-2, fp32 ? 0.1 : 0.5,
                     fp32 ? 1e-5 : 1e-3, "parameter " + std::to_string(i));
      for (std::size_t i = 0; i < want.buffers.size(); ++i)
        check_near(got.buffers[i], want.buffers[i], fp32 ? 1e-3 : 3e-2, "buffer " + std::to_string(i));
      e->wait_all();
    }
  }
}

TEST_CASE("memory format: conversions are ops named in traces, a channels_last model converts its input once" *
          doctest::timeout(60)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .cpu_devices = 1, .workers_per_cpu_device = 2});
  nn::Sequential net;
  net.emplace<nn::Conv2d>(*e, 3, 4, 3, ops::Conv2dParams{1, 1});
  net.emplace<nn::BatchNorm>(*e, 4);
  net.emplace<nn::ReLU>();
  net.emplace<nn::MaxPool2d>(ops::Pool2dParams{2, 2, 0});
  net.emplace<nn::Flatten>();
  net.emplace<nn::Dense>(*e, 4 * 3 * 2, 5);
  net.set_memory_format(MemoryFormat::channels_last);
  const Tensor x = Tensor::from_host(*e, Shape{2, 3, 6, 4}, host_values(2 * 3 * 6 * 4, 81)).set_name("images");
  e->profiler().start();
  const Tensor y = net.forward(x);
  const Tensor dx = net.backward(Tensor::ones(*e, y.shape()));
  e->wait_all();
  e->profiler().stop();
  CHECK(y.memory_format() == MemoryFormat::contiguous);
  CHECK(dx.memory_format() == MemoryFormat::channels_last);
  std::ostringstream trace;
  e->profiler().write_trace(trace);
  const std::string t = trace.str();
  const auto count = [&](const std::string& what) {
    std::size_t n = 0;
    for (std::size_t at = t.find(what); at != std::string::npos; at = t.find(what, at + 1)) ++n;
    return n;
  };
  // to_channels_last: the input (once), the filter for the forward and for
  // the data gradient, and Flatten's dx back to the model's format.
  CHECK(count(R"("name":"to_channels_last")") == 4);
  // to_contiguous: Flatten's forward, and the filter gradient (computed OHWI)
  // to the contiguous weight's format.
  CHECK(count(R"("name":"to_contiguous")") == 2);
}
