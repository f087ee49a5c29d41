// push_tensor_op / push_tensor_op_async: ops of one's own on tensors, ordered
// with the built-in ops, outputs created by the op that first writes them,
// tensors kept alive until an async op completes, and bad input refused at
// push time naming the op and the tensor. Naive and threaded engines.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <future>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensor_test_util.h"
#include "weft/error.h"
#include "weft/ops.h"
#include "weft/tensor_op.h"

using namespace weft_optest;

namespace {

using weft::RunContext;
using weft::TensorData;

TEST_CASE("tensor ops read and write tensors in order with built-in ops") {
  for_each_engine([](weft::Engine& e) {
    const std::int64_t n = 1000;
    const Tensor x = Tensor::uniform(e, Shape{n}, -1.0f, 1.0f, 3);
    Tensor y = Tensor::empty(e, Shape{n});  // created by the op below
    weft::push_tensor_op(
        Device::cpu(1), {x}, {y},
        [n](RunContext& ctx, const TensorData& d) {
          CHECK(ctx.device == Device::cpu(1));
          for (std::int64_t i = 0; i < n; ++i) d.out(0)[i] = 2.0f * d.in(0)[i] + 1.0f;
        },
        {.name = "2x + 1"});
    const Tensor z = y * 3.0f;  // after the op: reads y
    weft::push_tensor_op(Device::cpu(0), {}, {y}, [n](RunContext&, const TensorData& d) {
      for (std::int64_t i = 0; i < n; ++i) d.out(0)[i] = 0.0f;  // after z's read: write after read
    });
    const std::vector<float> xs = x.to_host(), zs = z.to_host(), ys = y.to_host();
    for (std::size_t i = 0; i < xs.size(); ++i) {
      CHECK(zs[i] == doctest::Approx(3.0f * (2.0f * xs[i] + 1.0f)));
      CHECK(ys[i] == 0.0f);
    }
  });
}

TEST_CASE("a tensor op writes every output it is given, past 32 too") {
  for_each_engine([](weft::Engine& e) {
    std::vector<Tensor> outs;
    for (int k = 0; k < 40; ++k) outs.push_back(Tensor::empty(e, Shape{2}));
    weft::push_tensor_op(Device::cpu(0), {}, outs, [](RunContext&, const TensorData& d) {
      for (std::size_t k = 0; k < 40; ++k) d.out(k)[0] = d.out(k)[1] = static_cast<float>(k);
    });
    for (int k = 0; k < 40; ++k)
      CHECK(outs[static_cast<std::size_t>(k)].to_host() == std::vector<float>{static_cast<float>(k), static_cast<float>(k)});
  });
}

TEST_CASE("an async tensor op keeps its tensors until it completes") {
  for_each_engine([](weft::Engine& e) {
    const std::int64_t n = 4096;
    Tensor out = Tensor::zeros(e, Shape{n});
    std::promise<void> release;
    std::shared_future<void> go = release.get_future().share();
    std::mutex worker_mutex;
    std::thread worker;
    std::atomic<std::size_t> in_use_then{0};
    const bool naive = e.kind() == "naive";  // its push_async returns only when the op is done
    if (naive) release.set_value();
    {
      const Tensor in = Tensor::full(e, Shape{n}, 7.0f);  // dropped before the op completes
      weft::push_tensor_op_async(
          Device::cpu(0), {in}, {out},
          [&worker, &worker_mutex, &in_use_then, &e, go, n](RunContext&, const TensorData& d, weft::Completion done) {
            // Stored under the lock: done() may wake the frontend before the
            // assignment below has finished.
            std::lock_guard lock(worker_mutex);
            worker = std::thread([d, done = std::move(done), go, n, &in_use_then, &e] {
              go.wait();  // the frontend has dropped `in` by now
              in_use_then = weft::memory_stats(e, Device::cpu(0)).in_use;  // `in` and `out` still held
              for (std::int64_t i = 0; i < n; ++i) d.out(0)[i] = d.in(0)[i] + 1.0f;
              done();
            });
          },
          {.name = "copy later"});
      if (!naive) release.set_value();
    }
    const std::vector<float> v = out.to_host();
    {
      std::lock_guard lock(worker_mutex);
      worker.join();
    }
    CHECK(in_use_then.load() >= 2 * static_cast<std::size_t>(n) * sizeof(float));
    CHECK(v.front() == 8.0f);
    CHECK(v.back() == 8.0f);
  });
}

TEST_CASE("tensor ops refuse bad input at push time, naming the op and the tensor") {
  for_each_engine([](weft::Engine& e) {
    const Tensor x = Tensor::zeros(e, Shape{4}).set_name("x");
    auto nop = [](RunContext&, const TensorData&) {};
    auto message = [](auto&& call) {
      try {
        call();
      } catch (const weft::InvalidArgument& err) {
        return std::string(err.what());
      }
      return std::string("(no InvalidArgument)");
    };
    CHECK(message([&] { weft::push_tensor_op(Device::cpu(0), {Tensor()}, {x}, nop, {.name = "bad"}); })
              .find("'bad'") != std::string::npos);
    CHECK(message([&] { weft::push_tensor_op(Device::cpu(0), {x}, {x}, weft::TensorOpFunction(), {.name = "empty"}); })
              .find("body is empty") != std::string::npos);
    auto other = weft::Engine::create({.kind = "naive"});
    const Tensor y = Tensor::zeros(*other, Shape{4}).set_name("y");
    CHECK(message([&] { weft::push_tensor_op(Device::cpu(0), {x}, {y}, nop, {.name = "two engines"}); })
              .find("another engine") != std::string::npos);
    CHECK(message([&] { weft::push_tensor_op(Device::cpu(0), {x}, {y}, nop, {.name = "two engines"}); })
              .find("(op 'two engines'): output 0 'y' [4] float32 on cpu(0) belongs to another engine") !=
          std::string::npos);
    CHECK(message([&] { weft::push_tensor_op(Device::cpu(0), {x, Tensor()}, {}, nop, {.name = "bad"}); })
              .find("(op 'bad'): input 1 is an undefined Tensor") != std::string::npos);
    CHECK(message([&] { weft::push_tensor_op(Device::cpu(0), {}, {}, nop, {.name = "nothing"}); })
              .find("no tensors") != std::string::npos);
  });
}

}  // namespace
