// Copies between every kind of memory round-trip bit for bit: pageable host
// memory of two CPU devices, pinned staging memory, one GPU (host<->GPU
// through the copy streams, GPU->GPU on one device) and, with two GPUs, peer
// copies. Copies into existing tensors overwrite them in push order.
#include <limits>

#include "gpu_test_util.h"

using namespace gputest;
namespace ops = weft::ops;

namespace {

std::vector<float> copy_data(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v = random_values(static_cast<std::size_t>(n), seed, -1e3f, 1e3f);
  const float specials[] = {-0.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::max()};
  for (std::size_t i = 0; i < v.size() && i < 5; ++i) v[(i * 7919) % v.size()] = specials[i];
  return v;
}

const std::int64_t kCopySizes[] = {0, 1, 2, 1023, 65537, (4 << 20) + 3};

}  // namespace

TEST_CASE("gpu copies - cpu cpu gpu pinned gpu cpu chain round-trips exactly" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .cpu_devices = 2, .gpu_devices = 1});
  std::uint64_t seed = 1;
  for (std::int64_t n : kCopySizes) {
    const std::vector<float> v = copy_data(n, ++seed);
    const std::string tag = " n=" + std::to_string(n);
    const Tensor a = Tensor::from_host(*e, Shape{n}, v, Device::cpu(0));
    const Tensor b = a.copy_to(Device::cpu(1));
    const Tensor c = b.copy_to(Device::gpu(0));
    const Tensor d = c.copy_to(Device::cpu_pinned(0));
    const Tensor f = d.copy_to(Device::gpu(0));
    const Tensor g = f.copy_to(Device::gpu(0));  // device to device on one GPU
    const Tensor h = g.copy_to(Device::cpu(0));
    CHECK(b.device() == Device::cpu(1));
    CHECK(c.device() == Device::gpu(0));
    CHECK(d.device() == Device::cpu_pinned(0));
    CHECK(f.device() == Device::gpu(0));
    CHECK(h.device() == Device::cpu(0));
    // Read the end first: nothing before it may have been waited for.
    expect_bits_equal(h.to_host(), v, "cpu(0) at the end" + tag);
    expect_bits_equal(g.to_host(), v, "gpu(0) copied on the gpu" + tag);
    expect_bits_equal(f.to_host(), v, "gpu(0) from pinned" + tag);
    expect_bits_equal(d.to_host(), v, "cpu_pinned(0)" + tag);
    expect_bits_equal(c.to_host(), v, "gpu(0) from cpu(1)" + tag);
    expect_bits_equal(b.to_host(), v, "cpu(1)" + tag);
    // Pageable GPU -> cpu(1) directly (staged through pinned memory).
    expect_bits_equal(c.copy_to(Device::cpu(1)).to_host(), v, "gpu(0) -> cpu(1)" + tag);
  }
  e->wait_all();
}

TEST_CASE("gpu copies - copy_from overwrites in push order" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1, .compute_streams_per_gpu = 4});
  // 4 MiB and a bit; 256 KiB under TSan, which checks every copied byte: push order, not
  // size, decides what each reader sees, and ASan and Release run the full size.
#if defined(__SANITIZE_THREAD__)
  const std::int64_t n = (1 << 16) + 5;
#else
  const std::int64_t n = (1 << 20) + 5;
#endif
  const std::vector<float> v1 = copy_data(n, 11), v2 = copy_data(n, 12), v3 = copy_data(n, 13);
  // One GPU tensor written by host->GPU copies, read by GPU->host copies and
  // GPU compute in between: every reader sees the value of its place in push order.
  Tensor g = Tensor::zeros(*e, Shape{n}, Device::gpu(0));
  Tensor host = Tensor::zeros(*e, Shape{n}, Device::cpu(0));
  Tensor pinned = Tensor::zeros(*e, Shape{n}, Device::cpu_pinned(0));
  std::vector<Tensor> snapshots;
  for (int round = 0; round < 20; ++round) {
    const std::vector<float>& v = round % 3 == 0 ? v1 : round % 3 == 1 ? v2 : v3;
    g.copy_from(Tensor::from_host(*e, Shape{n}, v, Device::cpu(0)));
    snapshots.push_back(g.copy_to(Device::cpu(0)));      // d2h stream + host op
    snapshots.push_back(ops::mul_scalar(g, 1.0f));       // a compute stream
    host.copy_from(g);                                   // into pageable memory
    pinned.copy_from(host);                              // host op
    g.copy_from(pinned);                                 // h2d stream (same values)
    snapshots.push_back(pinned.copy_to(Device::gpu(0)));
  }
  for (std::size_t s = 0; s < snapshots.size(); ++s) {
    const int round = static_cast<int>(s / 3);
    const std::vector<float>& v = round % 3 == 0 ? v1 : round % 3 == 1 ? v2 : v3;
    if (s % 3 == 1)  // computed (x * 1): a GPU that flushed denormals would be allowed that much
      expect_close(snapshots[s].to_host(), v, 0, 1e-37, "compute snapshot " + std::to_string(s));
    else
      expect_bits_equal(snapshots[s].to_host(), v, "copy snapshot " + std::to_string(s));
  }
  expect_bits_equal(g.to_host(), v2, "final gpu tensor");  // round 19: 19 % 3 == 1
  expect_bits_equal(host.to_host(), v2, "final host tensor");
  e->wait_all();
}

TEST_CASE("gpu copies - peer copies between two gpus round-trip exactly" * doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  if (weft::gpu::device_count() < 2) {
    std::printf("[weft-skip] peer copies need two GPUs, %d answer\n", weft::gpu::device_count());
    return;
  }
  auto e = make_engine({.kind = "threaded", .gpu_devices = 2});
  std::uint64_t seed = 50;
  for (std::int64_t n : kCopySizes) {
    const std::vector<float> v = copy_data(n, ++seed);
    const std::string tag = " n=" + std::to_string(n);
    const Tensor a = Tensor::from_host(*e, Shape{n}, v, Device::gpu(0));
    const Tensor b = a.copy_to(Device::gpu(1));
    const Tensor c = b.copy_to(Device::gpu(0));
    const Tensor d = ops::mul_scalar(b, 1.0f).copy_to(Device::cpu_pinned(0)).copy_to(Device::gpu(1));
    CHECK(b.device() == Device::gpu(1));
    expect_bits_equal(c.to_host(), v, "gpu(0) -> gpu(1) -> gpu(0)" + tag);
    expect_bits_equal(b.to_host(), v, "gpu(1)" + tag);
    // Computed (x * 1): compare values (denormals may flush).
    expect_close(d.to_host(), v, 0, 1e-37, "gpu(1) compute -> pinned -> gpu(1)" + tag);
    // A peer copy into an existing tensor, then overwritten by a later one.
    Tensor dst = Tensor::zeros(*e, Shape{n}, Device::gpu(1));
    dst.copy_from(a);
    const Tensor snap = dst.copy_to(Device::cpu(0));
    dst.copy_from(Tensor::full(*e, Shape{n}, 2.0f, Device::gpu(0)));
    expect_bits_equal(snap.to_host(), v, "peer copy_from snapshot" + tag);
    for (float x : dst.to_host()) REQUIRE(x == 2.0f);
  }
  e->wait_all();
}
