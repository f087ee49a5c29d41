// Checkpoints of GPU tensors (weft/checkpoint.h): saved from GPUs (whole and
// in pieces from two GPUs, snapshots taken after the writes pushed before
// and kept from those pushed after), loaded back bitwise into GPU tensors
// and CPU tensors. Each scenario over the naive engine and the threaded one
// at several worker counts.
#include <unistd.h>

#include <atomic>
#include <bit>
#include <filesystem>

#include "gpu_test_util.h"
#include "weft/checkpoint.h"

using namespace gputest;
namespace ckpt = weft::checkpoint;
namespace fs = std::filesystem;
using weft::DType;

namespace {

struct CkptGpuTmpDir {
  fs::path path;
  CkptGpuTmpDir() {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("weft-ckpt-gpu-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~CkptGpuTmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::vector<float> ckpt_gpu_values(std::size_t n, std::uint64_t seed, DType t) {
  std::vector<float> v = random_values(n, seed, -4.0f, 4.0f);
  for (float& x : v) {
    if (t == DType::bfloat16) x = weft::bfloat16_to_float(weft::float_to_bfloat16(x));
    if (t == DType::float16) x = weft::float16_to_float(weft::float_to_float16(x));
  }
  return v;
}

}  // namespace

TEST_CASE("gpu checkpoint - GPU tensors save and load back bitwise, on GPUs and CPUs" * doctest::timeout(180)) {
  WEFT_REQUIRE_GPU();
  const int gpus = std::min(weft::gpu::device_count(), 2);
  with_each_gpu_engine(gpus, [&](Engine& e) {
    CkptGpuTmpDir tmp;
    const Device g0 = Device::gpu(0), g1 = Device::gpu(gpus - 1);
    std::uint64_t seed = 1;
    for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
      INFO("dtype " << weft::to_string(t));
      const fs::path dir = tmp.path / std::string(weft::to_string(t));
      const std::vector<float> a = ckpt_gpu_values(6 * 5, seed++, t), p = ckpt_gpu_values(17, seed++, t);
      Tensor ta = Tensor::from_host(e, Shape{6, 5}, a, g0, t);
      // p in two pieces, one per GPU.
      Tensor p0 = Tensor::from_host(e, Shape{9}, std::vector<float>(p.begin(), p.begin() + 9), g0, t);
      Tensor p1 = Tensor::from_host(e, Shape{8}, std::vector<float>(p.begin() + 9, p.end()), g1, t);
      ckpt::PendingSave save = ckpt::save(
          e, dir, {{"a", ta}, {"p", p0, Shape{17}, 0, 9}, {"p", p1, Shape{17}, 9, 17}}, {.metadata = {{"k", "v"}}});
      // Written after the save: not in the checkpoint.
      ta.copy_from(Tensor::full(e, Shape{6, 5}, 7.0f, g0, t));
      p1.copy_from(Tensor::full(e, Shape{8}, 7.0f, g1, t));
      save.wait();

      const ckpt::Reader reader = ckpt::Reader::open(dir);
      CHECK(reader.metadata().at("k") == "v");
      // Into GPU tensors: a on the other GPU, p whole on gpu(0).
      Tensor ga = Tensor::zeros(e, Shape{6, 5}, g1, t);
      Tensor gp = Tensor::zeros(e, Shape{17}, g0, t);
      ckpt::load(reader, {{"a", ga}, {"p", gp}});
      expect_bits_equal(ga.to_host(), a, "a into " + g1.str());
      expect_bits_equal(gp.to_host(), p, "p into " + g0.str());
      // Into CPU tensors, p split otherwise (three pieces, one on a GPU).
      Tensor ca = Tensor::zeros(e, Shape{6, 5}, Device::cpu(0), t);
      Tensor c0 = Tensor::zeros(e, Shape{5}, Device::cpu(0), t);
      Tensor c1 = Tensor::zeros(e, Shape{6}, g1, t);
      Tensor c2 = Tensor::zeros(e, Shape{6}, Device::cpu(0), t);
      ckpt::load(reader, {{"a", ca}, {"p", c0, Shape{17}, 0, 5}, {"p", c1, Shape{17}, 5, 11}, {"p", c2, Shape{17}, 11, 17}});
      expect_bits_equal(ca.to_host(), a, "a into cpu(0)");
      expect_bits_equal(c0.to_host(), std::vector<float>(p.begin(), p.begin() + 5), "p[0:5]");
      expect_bits_equal(c1.to_host(), std::vector<float>(p.begin() + 5, p.begin() + 11), "p[5:11]");
      expect_bits_equal(c2.to_host(), std::vector<float>(p.begin() + 11, p.end()), "p[11:17]");
      // A refused load leaves the GPU tensor as it was.
      Tensor wrong = Tensor::full(e, Shape{6, 4}, 3.0f, g0, t);
      CHECK_THROWS_AS(ckpt::load(reader, {{"a", wrong}, {"p", gp}}), weft::InvalidArgument);
      CHECK(wrong.to_host() == std::vector<float>(24, 3.0f));
    }
  });
}
