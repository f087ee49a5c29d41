// A complete embedding: push ops with their read and write sets, let the
// engine overlap what is independent, read the result back.
#include <weft/engine.h>

#include <cstdio>
#include <numeric>
#include <vector>

int main() {
  auto engine = weft::Engine::create(weft::EngineConfig{});  // WEFT_ENGINE, WEFT_CPU_WORKERS apply

  std::vector<double> a(1 << 20), b(1 << 20), sum(1);
  weft::Var va = engine->new_var("a"), vb = engine->new_var("b"), vsum = engine->new_var("sum");

  // Independent producers: may run at the same time on two workers.
  engine->push([&](weft::RunContext&) { std::iota(a.begin(), a.end(), 0.0); }, weft::Device::cpu(0), {}, {va},
               {.name = "fill a"});
  engine->push([&](weft::RunContext&) { std::fill(b.begin(), b.end(), 2.0); }, weft::Device::cpu(0), {}, {vb},
               {.name = "fill b"});
  // Reads both: runs after both writes, in push order.
  engine->push(
      [&](weft::RunContext&) { sum[0] = std::inner_product(a.begin(), a.end(), b.begin(), 0.0); },
      weft::Device::cpu(0), {va, vb}, {vsum}, {.name = "dot"});

  try {
    engine->wait_to_read(vsum);  // rethrows an op's exception, if one failed
  } catch (const std::exception& e) {
    std::fprintf(stderr, "embed: an op failed: %s\n", e.what());
    return 1;
  }
  const double n = static_cast<double>(a.size());
  const double expected = (n - 1) * n;  // 2 * (0 + 1 + ... + n-1)
  std::printf("embed: %s engine, dot = %.0f (expected %.0f), versions a=%llu b=%llu sum=%llu\n",
              std::string(engine->kind()).c_str(), sum[0], expected,
              static_cast<unsigned long long>(engine->version(va)), static_cast<unsigned long long>(engine->version(vb)),
              static_cast<unsigned long long>(engine->version(vsum)));
  return sum[0] == expected ? 0 : 1;
}
