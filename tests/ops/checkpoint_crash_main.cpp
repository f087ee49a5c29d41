// A checkpoint writer that crashes where it is told, for
// tests/ops/test_checkpoint_durability.cpp (a separate program: a forked
// copy of the test binary would lack the background writer's thread).
//   weft-test-checkpoint-crash save RUN_DIR STEP RANKS KEEP POINT NTH
//     saves checkpoint RUN_DIR/step-<STEP> as RANKS writers of one process
//     (rank RANKS-1 first, rank 0 last, on the naive engine), with run_dir
//     RUN_DIR and keep KEEP; the process SIGKILLs itself the NTH time it
//     reaches crash point POINT ("-": never; checkpoint_io.h lists them).
//     Its tensors: "w" [10, 10] in one piece per writer and "m" [3] (rank
//     0), every element STEP * 1000 + its index (so a load can tell which
//     save each element came from). Exit status 0 once saved.
//   weft-test-checkpoint-crash lock RUN_DIR
//     takes RUN_DIR's lock, prints "locked" and sleeps until killed.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "checkpoint_io.h"
#include "weft/checkpoint.h"
#include "weft/engine.h"
#include "weft/tensor.h"

namespace {

namespace ckpt = weft::checkpoint;
using weft::Shape;
using weft::Tensor;

std::vector<float> values(int step, std::int64_t begin, std::int64_t end) {
  std::vector<float> v;
  for (std::int64_t i = begin; i < end; ++i) v.push_back(static_cast<float>(step * 1000 + i));
  return v;
}

int save(const std::filesystem::path& run, int step, int ranks, int keep, const std::string& point, int nth) {
  if (point != "-") ckpt::detail::set_crash_point(point, nth);
  auto engine = weft::Engine::create({.kind = "naive", .cpu_devices = 1});
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  const std::int64_t n = 100, per = (n + ranks - 1) / ranks;
  // One identity for the ranks of this save, new for each save (as
  // DataParallel agrees on one).
  std::random_device device;
  const std::string save_id = "crash-" + std::to_string(device()) + "-" + std::to_string(device());
  for (int r = ranks - 1; r >= 0; --r) {
    const std::int64_t lo = std::min(n, r * per), hi = std::min(n, (r + 1) * per);
    std::vector<ckpt::Entry> entries{
        {"w", Tensor::from_host(*engine, Shape{hi - lo}, values(step, lo, hi)), Shape{10, 10}, lo, hi}};
    if (r == 0) entries.push_back({"m", Tensor::from_host(*engine, Shape{3}, values(step, 0, 3))});
    ckpt::save(*engine, run / name, entries,
               {.rank = r,
                .ranks = ranks,
                .metadata = {{"step", std::to_string(step)}},
                .run_dir = run,
                .keep = keep,
                .save_id = save_id})
        .wait();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> a(argv + 1, argv + argc);
    if (a.size() == 7 && a[0] == "save")
      return save(a[1], std::stoi(a[2]), std::stoi(a[3]), std::stoi(a[4]), a[5], std::stoi(a[6]));
    if (a.size() == 2 && a[0] == "lock") {
      ckpt::lock_run(a[1]);
      std::printf("locked\n");
      std::fflush(stdout);
      for (;;) ::pause();
    }
    std::fprintf(stderr, "usage: %s save RUN_DIR STEP RANKS KEEP POINT NTH | lock RUN_DIR\n", argv[0]);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", argv[0], e.what());
    return 1;
  }
}
