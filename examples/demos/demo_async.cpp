// Demo 1: pushing returns at once. 1000 x (y = x + 1) with a wait after each
// push, then with one wait at the end; then 10 x (random n x n, matmul), where
// the last push returns long before wait_all.
#include <cstdio>

#include <weft/tensor.h>

#include "demos.h"

namespace weft::demo {

void add_flags(DemoCli& cli, AsyncOptions& o) {
  cli.add("--ops", &o.ops, "pushes of y = x + 1");
  cli.add("--elements", &o.elements, "elements of x");
  cli.add("--products", &o.products, "random matrices multiplied");
  cli.add("--n", &o.n, "their size n x n");
  cli.add("--device", &o.device, "cpu:0 or gpu:0");
}

nlohmann::json run_async(const AsyncOptions& o, const CommonOptions& c) {
  const Device device = Device::parse(o.device);
  auto engine = make_engine(c);
  Engine& e = *engine;
  const Tensor x = Tensor::ones(e, {o.elements}, device);
  x.wait_to_read();

  Tensor y;
  const double each = time_seconds([&] {
    for (std::int64_t i = 0; i < o.ops; ++i) {
      y = x + 1.0f;
      y.wait_to_read();
    }
  });
  double once = 0;
  traced(e, c, [&] {
    once = time_seconds([&] {
      for (std::int64_t i = 0; i < o.ops; ++i) y = x + 1.0f;
      y.wait_to_read();
    });
  });
  const float check = y.to_host()[0];
  if (check != 2.0f) throw Error("demo async: y = x + 1 gave " + std::to_string(check) + ", not 2");

  double pushed = 0, finished = 0;
  std::vector<Tensor> results;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::int64_t i = 0; i < o.products; ++i) {
    const Tensor a = Tensor::uniform(e, {o.n, o.n}, -1.0f, 1.0f, static_cast<std::uint64_t>(i), device);
    results.push_back(a.matmul(a));
  }
  pushed = seconds_since(t0);
  e.wait_all();
  finished = seconds_since(t0);

  if (!c.quiet) {
    std::printf("1. Asynchronous dispatch on %s (%s)\n\n", device.str().c_str(), hardware(e).c_str());
    Table t({std::to_string(o.ops) + " x (y = x + 1), " + std::to_string(o.elements) + " floats", "time",
             "per op"});
    t.row({"wait_to_read after each push", ms(each), fixed(each * 1e6 / o.ops, 2) + " us"});
    t.row({"one wait at the end", ms(once), fixed(once * 1e6 / o.ops, 2) + " us"});
    t.print();
    std::printf(" one wait instead of one per push: %.2fx the speed (above 1 when the frontend's pushing\n"
                " overlaps the workers' running; ops this small cost about as much to push as to run)\n\n",
                each / once);
    Table m({std::to_string(o.products) + " x (random " + std::to_string(o.n) + "^2, matmul)", "time"});
    m.row({"all pushes returned", ms(pushed)});
    m.row({"wait_all returned", ms(finished)});
    m.print();
    std::printf(" pushing took %.2f%% of the run: the frontend was free for the rest\n", 100.0 * pushed / finished);
    print_trace_note(e, c);
  }
  return {{"demo", "async"},
          {"hardware", hardware(e)},
          {"device", device.str()},
          {"ops", o.ops},
          {"wait_each_ms", each * 1e3},
          {"wait_once_ms", once * 1e3},
          {"speedup", each / once},
          {"products", o.products},
          {"n", o.n},
          {"push_ms", pushed * 1e3},
          {"total_ms", finished * 1e3}};
}

}  // namespace weft::demo
