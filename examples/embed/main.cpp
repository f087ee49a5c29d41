// A complete embedding, built outside the Weft tree against the installed
// package (CMake or pkg-config): push ops with their read and write sets, let
// the engine overlap what is independent, read the result back.
#include <weft/engine.h>

#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

int main() {
  auto engine = weft::Engine::create();  // WEFT_ENGINE, WEFT_CPU_WORKERS apply

  std::vector<double> a(1 << 20), b(1 << 20);
  double sum = 0;
  weft::SharedVar va(*engine, "a"), vb(*engine, "b"), vsum(*engine, "sum");

  // Independent producers: may run at the same time on two workers.
  engine->push([&] { std::iota(a.begin(), a.end(), 0.0); }, {}, {va}, {.name = "fill a"});
  engine->push([&] { std::fill(b.begin(), b.end(), 2.0); }, {}, {vb}, {.name = "fill b"});
  // Reads both: runs after both writes, in push order.
  engine->push([&] { sum = std::inner_product(a.begin(), a.end(), b.begin(), 0.0); }, {va, vb}, {vsum},
               {.name = "dot"});

  try {
    engine->wait_to_read(vsum);  // rethrows an op's exception, if one failed
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed: an op failed: %s\n", e.what());
    return 1;
  }
  const double n = static_cast<double>(a.size());
  const double expected = (n - 1) * n;  // 2 * (0 + 1 + ... + n-1)
  std::printf("embed: %s engine, dot = %.0f (expected %.0f), versions a=%llu b=%llu sum=%llu\n",
              std::string(engine->kind()).c_str(), sum, expected,
              static_cast<unsigned long long>(engine->version(va)), static_cast<unsigned long long>(engine->version(vb)),
              static_cast<unsigned long long>(engine->version(vsum)));
  return sum == expected ? 0 : 1;
}
