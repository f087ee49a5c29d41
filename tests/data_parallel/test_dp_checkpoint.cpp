// DataParallel checkpoints on CPU devices: a run saved after k steps under
// one member count and shard setting, loaded into another (2 -> 3 members,
// stage 1 -> stage 2; stage 3 -> one member unsharded; 2 -> 2 members stage
// 1 -> stage 3) and continued ends where the uninterrupted run ends — bit
// for bit where the arithmetic is the same, within 1e-5 where the batch
// split or the sums' order differ — with the optimizer state, the step
// count and the loss scaler restored. The checkpoint names the state as an
// unsharded one-device model does; a checkpoint of another model (or
// optimizer) is refused, naming the key, with the state left as it was.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "data_parallel/zero_util.h"
#include "engine/engine_test_util.h"
#include "weft/checkpoint.h"

using namespace zero_test;
using weft_test::contains;
using weft_test::error_of;
namespace ckpt = weft::checkpoint;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the system's temporary one, removed at the end.
struct DpCkptDir {
  fs::path path;
  explicit DpCkptDir(const std::string& what)
      : path(fs::temp_directory_path() / ("weft-dp-ckpt-" + what + "-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~DpCkptDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

std::unique_ptr<par::DataParallel> dp_ckpt_make(Engine& e, int members, par::DataParallelOptions options) {
  return std::make_unique<par::DataParallel>(
      e, cpus(members), [&e](Device d) { return nn::mlp(e, {20, 32, 16, 5}, d, 7 + static_cast<std::uint64_t>(d.index())); },
      std::move(options));
}

}  // namespace

TEST_CASE("dp checkpoint: saved on N members under one shard setting, resumed on M under another, ends as the "
          "uninterrupted run" *
          doctest::timeout(300)) {
  const std::vector<Batch> batches = mlp_batches(4, 12, 17);
  const std::vector<Batch> first(batches.begin(), batches.begin() + 2), rest(batches.begin() + 2, batches.end());
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(0.01f);
  const par::DataParallelOptions base{.bucket_bytes = 700, .loss_scaling = par::LossScaling{.init_scale = 256.0f}};
  struct Case {
    int save_members;
    par::Shard save_shard;
    int load_members;
    par::Shard load_shard;
    bool bitwise;  // the same members (the same split and sums)
  };
  const Case cases[] = {
      {2, par::Shard::optimizer, 3, par::Shard::gradients, false},
      {2, par::Shard::parameters, 1, par::Shard::none, false},
      {2, par::Shard::optimizer, 2, par::Shard::parameters, true},
      {3, par::Shard::none, 2, par::Shard::optimizer, false},
  };
  weft_test::with_each_engine(3, [&](Engine& e) {
    auto whole = dp_ckpt_make(e, 2, zero_options(par::Shard::none, opt, base));
    train_steps(*whole, batches);
    const auto want = zero_weights(*whole);
    for (const Case& c : cases) {
      const std::string what = std::to_string(c.save_members) + " members, Shard::" +
                               std::string(par::to_string(c.save_shard)) + " -> " + std::to_string(c.load_members) +
                               " members, Shard::" + std::string(par::to_string(c.load_shard));
      INFO(what);
      DpCkptDir dir("resume");
      {
        auto a = dp_ckpt_make(e, c.save_members, zero_options(c.save_shard, opt, base));
        train_steps(*a, first);
        a->save_checkpoint(dir.path / "step-2", {{"note", "two steps"}}).wait();
      }
      const ckpt::Reader reader = ckpt::Reader::open(dir.path / "step-2");
      CHECK(reader.metadata().at("weft.steps") == "2");
      CHECK(reader.metadata().at("note") == "two steps");
      // Named as an unsharded one-device model names them.
      for (const char* name : {"fc1.weight", "fc3.bias", "fc1.weight.exp_avg", "fc2.bias.exp_avg_sq", "fc1.weight.step",
                               "loss_scale.scale", "loss_scale.growth_tracker", "loss_scale.skipped"})
        CHECK_MESSAGE(reader.has(name), name);
      CHECK(reader.shape("fc1.weight.exp_avg") == Shape{32, 20});

      auto b = dp_ckpt_make(e, c.load_members, zero_options(c.load_shard, opt, base));
      b->load_checkpoint(reader);
      CHECK(b->steps() == 2);
      train_steps(*b, rest);
      CHECK(b->steps() == 4);
      CHECK(b->loss_scale() == whole->loss_scale());
      for (int r = 0; r < b->replicas(); ++r) {
        if (c.bitwise)
          zero_expect_bitwise(zero_weights(*b, r), want, what);
        else
          expect_close(zero_weights(*b, r), want, 1e-5, what);
      }
    }
  });
}

TEST_CASE("dp checkpoint: a checkpoint of another model or optimizer is refused, naming the key, and the state stays" *
          doctest::timeout(120)) {
  const std::vector<Batch> batches = mlp_batches(1, 8, 3);
  const optim::OptimizerOptions opt = optim::OptimizerOptions::adamw(0.01f);
  weft_test::with_each_engine(2, [&](Engine& e) {
    DpCkptDir dir("bad");
    {
      // Another model: fc2 has 8 outputs instead of 16.
      par::DataParallel other(e, cpus(2), [&](Device d) { return nn::mlp(e, {20, 32, 8, 5}, d, 1); },
                              zero_options(par::Shard::none, opt));
      train_steps(other, batches);
      other.save_checkpoint(dir.path / "other").wait();
      // The same model with plain SGD: no optimizer state.
      auto sgd = dp_ckpt_make(e, 2, zero_options(par::Shard::none, optim::OptimizerOptions::sgd(0.1f)));
      train_steps(*sgd, batches);
      sgd->save_checkpoint(dir.path / "sgd").wait();
    }
    for (par::Shard shard : {par::Shard::none, par::Shard::parameters}) {
      auto dp = dp_ckpt_make(e, 2, zero_options(shard, opt));
      train_steps(*dp, batches);
      const auto before = zero_weights(*dp);
      const std::vector<std::size_t> state_before = dp->state_bytes();
      const std::string shape_error = error_of([&] { dp->load_checkpoint(ckpt::Reader::open(dir.path / "other")); });
      CHECK(contains(shape_error, "other"));
      CHECK(contains(shape_error, "key 'fc2.bias' has shape [8] but this model's is [16]"));
      const std::string missing = error_of([&] { dp->load_checkpoint(ckpt::Reader::open(dir.path / "sgd")); });
      CHECK(contains(missing, "key 'fc1.bias.exp_avg' is missing"));
      zero_expect_bitwise(zero_weights(*dp), before, "after the refused loads, Shard::" + std::string(par::to_string(shard)));
      CHECK(dp->steps() == 1);
      CHECK(dp->state_bytes() == state_before);
      // And an extra key: the AdamW checkpoint into a plain-SGD trainer.
      DpCkptDir mine("mine");
      dp->save_checkpoint(mine.path / "adamw").wait();
      auto plain = dp_ckpt_make(e, 2, zero_options(shard, optim::OptimizerOptions::sgd(0.1f)));
      CHECK(contains(error_of([&] { plain->load_checkpoint(ckpt::Reader::open(mine.path / "adamw")); }),
                     "is not part of this model's training state"));
    }
  });
}
