// Demo 2: what each barrier waits for. A chain of matmuls is queued after an
// intermediate result; wait_to_read(intermediate) returns as soon as that one
// is ready, wait_all only when the whole chain is done. to_host() and item()
// are barriers too, on their own tensor only.
#include <cstdio>

#include <weft/ops.h>
#include <weft/tensor.h>

#include "demos.h"

namespace weft::demo {

void add_flags(DemoCli& cli, BarrierOptions& o) {
  cli.add("--n", &o.n, "matrix size n x n");
  cli.add("--chain", &o.chain, "matmuls queued after the intermediate");
  cli.add("--device", &o.device, "cpu:0 or gpu:0");
}

namespace {
struct Work {
  Tensor intermediate, last;
};
// x -> intermediate = x * x -> chain of products (scaled to stay finite).
Work push_work(Engine& e, const BarrierOptions& o, Device device, std::uint64_t seed) {
  const Tensor x = Tensor::uniform(e, {o.n, o.n}, -1.0f, 1.0f, seed, device);
  Work w;
  w.intermediate = x.matmul(x) * (1.0f / static_cast<float>(o.n));
  Tensor t = w.intermediate;
  for (std::int64_t i = 0; i < o.chain; ++i) t = t.matmul(t) * (1.0f / static_cast<float>(o.n));
  w.last = t;
  return w;
}
}  // namespace

nlohmann::json run_barriers(const BarrierOptions& o, const CommonOptions& c) {
  const Device device = Device::parse(o.device);
  auto engine = make_engine(c);
  Engine& e = *engine;
  (void)push_work(e, o, device, 99);  // warm-up: caches, kernel selection
  e.wait_all();

  double to_intermediate = 0, to_all = 0, only_all = 0, item_s = 0, to_host_s = 0;
  std::size_t in_flight_after_item = 0;
  traced(e, c, [&] {
    const auto t0 = std::chrono::steady_clock::now();
    Work w = push_work(e, o, device, 1);
    w.intermediate.wait_to_read();
    to_intermediate = seconds_since(t0);
    e.wait_all();
    to_all = seconds_since(t0);
  });
  only_all = time_seconds([&] {
    (void)push_work(e, o, device, 2);
    e.wait_all();
  });
  {
    const auto t0 = std::chrono::steady_clock::now();
    Work w = push_work(e, o, device, 3);
    const float s = w.intermediate.sum().item();  // waits for the sum only
    item_s = seconds_since(t0);
    in_flight_after_item = e.inflight();
    (void)s;
    e.wait_all();
  }
  {
    const auto t0 = std::chrono::steady_clock::now();
    Work w = push_work(e, o, device, 4);
    const std::vector<float> host = w.intermediate.to_host();
    to_host_s = seconds_since(t0);
    (void)host;
    e.wait_all();
  }
  if (!c.quiet) {
    std::printf("2. Barriers on %s (%s)\n\n", device.str().c_str(), hardware(e).c_str());
    Table t({"x -> intermediate -> " + std::to_string(o.chain) + " more matmuls (" + std::to_string(o.n) + "^2)",
             "returned after"});
    t.row({"wait_to_read(intermediate)", ms(to_intermediate)});
    t.row({"  then wait_all", ms(to_all)});
    t.row({"wait_all alone", ms(only_all)});
    t.row({"intermediate.sum().item()", ms(item_s)});
    t.row({"intermediate.to_host()", ms(to_host_s)});
    t.print();
    std::printf(" wait_to_read returns once its variable is ready (%.0f%% of wait_all); item() and to_host()\n"
                " block on their tensor alone: %zu ops were still in flight when item() returned\n",
                100.0 * to_intermediate / to_all, in_flight_after_item);
    print_trace_note(e, c);
  }
  return {{"demo", "barriers"},
          {"hardware", hardware(e)},
          {"device", device.str()},
          {"n", o.n},
          {"chain", o.chain},
          {"wait_to_read_ms", to_intermediate * 1e3},
          {"then_wait_all_ms", to_all * 1e3},
          {"wait_all_ms", only_all * 1e3},
          {"item_ms", item_s * 1e3},
          {"to_host_ms", to_host_s * 1e3},
          {"in_flight_after_item", in_flight_after_item}};
}

}  // namespace weft::demo
