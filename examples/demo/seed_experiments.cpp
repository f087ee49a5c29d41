#include "seed_experiments.h"

#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <vector>

namespace weft::demo {

namespace {
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

AsyncDispatchResult async_dispatch(Engine& engine, int ops, int elements) {
  std::vector<float> x(static_cast<std::size_t>(elements), 1.0f);
  std::vector<float> y(x.size());
  Var vx = engine.new_var("x");
  Var vy = engine.new_var("y");
  auto add_one = [&](RunContext&) {
    for (std::size_t i = 0; i < x.size(); ++i) y[i] = x[i] + 1.0f;
  };
  AsyncDispatchResult r;
  r.ops = ops;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) {
    engine.push(add_one, Device::cpu(0), {vx}, {vy}, {.name = "y=x+1"});
    engine.wait_to_read(vy);
  }
  r.wait_each_s = seconds_since(start);
  start = std::chrono::steady_clock::now();
  for (int i = 0; i < ops; ++i) engine.push(add_one, Device::cpu(0), {vx}, {vy}, {.name = "y=x+1"});
  engine.wait_to_read(vy);
  r.wait_once_s = seconds_since(start);
  engine.delete_var(vx);
  engine.delete_var(vy);
  engine.wait_all();
  return r;
}

MatmulResult async_matmuls(Engine& engine, int products, int n) {
  const std::size_t size = static_cast<std::size_t>(n) * static_cast<std::size_t>(n);
  struct Product {
    std::vector<float> a, c;
    Var va, vc;
  };
  std::vector<std::unique_ptr<Product>> work;
  for (int i = 0; i < products; ++i) {
    auto p = std::make_unique<Product>();
    p->a.resize(size);
    p->c.resize(size);
    char name[32];
    std::snprintf(name, sizeof name, "A%d", i);
    p->va = engine.new_var(name);
    std::snprintf(name, sizeof name, "C%d", i);
    p->vc = engine.new_var(name);
    work.push_back(std::move(p));
  }
  MatmulResult r;
  r.products = products;
  r.n = n;
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < products; ++i) {
    Product* p = work[static_cast<std::size_t>(i)].get();
    engine.push(
        [p, i](RunContext&) {
          std::mt19937 gen(static_cast<unsigned>(i));
          std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
          for (float& v : p->a) v = uniform(gen);
        },
        Device::cpu(0), {}, {p->va}, {.name = "random"});
    engine.push(
        [p, n](RunContext&) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, p->a.data(), n, p->a.data(), n,
                      0.0f, p->c.data(), n);
        },
        Device::cpu(0), {p->va}, {p->vc}, {.name = "matmul"});
  }
  r.push_s = seconds_since(start);
  engine.wait_all();
  r.total_s = seconds_since(start);
  for (auto& p : work) {
    r.checksum += p->c[0] + p->c[size - 1];
    engine.delete_var(p->va);
    engine.delete_var(p->vc);
  }
  engine.wait_all();
  return r;
}

}  // namespace weft::demo
