// Read/write ordering: ops name the variables they read and write; the engine
// runs each as soon as those allow. Writers of one variable run in push
// order, readers of it run together, and independent ops overlap.
#include <weft/engine.h>

#include <cstdio>
#include <numeric>
#include <vector>

int main() {
  auto engine = weft::Engine::create();
  std::vector<double> a(1 << 20), b(1 << 20);
  double dot = 0;
  // Owning handles: each variable is deleted once its last handle goes.
  weft::SharedVar va(*engine, "a"), vb(*engine, "b"), vdot(*engine, "dot");

  // Independent writers: may run at the same time (on cpu(0)'s workers).
  engine->push([&] { std::iota(a.begin(), a.end(), 0.0); }, {}, {va});
  engine->push([&] { std::fill(b.begin(), b.end(), 2.0); }, {}, {vb});
  // Reads a and b: runs after both writes.
  engine->push([&] { dot = std::inner_product(a.begin(), a.end(), b.begin(), 0.0); }, {va, vb}, {vdot});
  // Writes a again: waits for the reader above (write after read).
  engine->push([&] { a.assign(a.size(), 0.0); }, {}, {va});

  engine->wait_to_read(vdot);  // blocks until dot is written
  const double n = static_cast<double>(a.size());
  std::printf("dot = %.0f (expected %.0f)\n", dot, (n - 1) * n);
  engine->wait_all();
  std::printf("a was written %llu times\n", static_cast<unsigned long long>(engine->version(va)));
  return dot == (n - 1) * n ? 0 : 1;
}
