// Priorities: among ops ready at once on one device, higher priority runs
// first (FIFO among equals). Useful to let gradient communication or the
// next batch's loading jump ahead of bulk work.
#include <weft/engine.h>

#include <cstdio>
#include <future>
#include <mutex>
#include <string>
#include <vector>

int main() {
  // One worker, so that the order is visible.
  auto engine = weft::Engine::create({.cpu_devices = 1, .workers_per_cpu_device = 1});
  std::promise<void> open;
  std::shared_future<void> gate = open.get_future().share();
  std::mutex m;
  std::vector<std::string> order;

  weft::SharedVar held(*engine, "held");
  engine->push([gate] { gate.wait(); }, {}, {held}, {.name = "hold the worker"});
  auto record = [&](std::string what) {
    return [&, what] {
      std::lock_guard lock(m);
      order.push_back(what);
    };
  };
  // Queued while the worker is held; each writes its own variable (all ready).
  struct Job {
    int priority;
    const char* what;
  };
  std::vector<weft::SharedVar> vars;
  for (Job job : {Job{0, "bulk 1"}, Job{0, "bulk 2"}, Job{10, "urgent"}, Job{-5, "background"}}) {
    vars.emplace_back(*engine, job.what);
    engine->push(record(job.what), {}, {vars.back()}, {.priority = job.priority, .name = job.what});
  }
  open.set_value();
  engine->wait_all();
  for (const std::string& s : order) std::printf("%s\n", s.c_str());
  return order == std::vector<std::string>{"urgent", "bulk 1", "bulk 2", "background"} ? 0 : 1;
}
