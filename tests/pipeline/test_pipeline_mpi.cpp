// Pipelines across MPI processes (ctest runs this binary alone and under
// mpirun with 2 and 3 ranks, and with 4 for pipeline x data parallel): one
// stage (or, interleaved, one rank's chunks) per process, activations and
// gradients by send and recv. Every schedule equals the unpipelined model on
// one device within 1e-5 (MLP and LeNet, micro-batches that do not divide
// the batch, fewer micro-batches than stages); plans that differ between
// ranks fail on every rank naming both before any data moves; a schedule
// whose stages are not the ranks is refused; a rank that stalls mid-step
// fails the others at the deadline, each naming a neighbour that went quiet
// (the stalled rank, or one waiting for it); 2 stages x 2 replicas equal one
// device on the whole batch. In bf16 and in fp16 with loss scaling the
// pipeline equals one device in the same precision within 1e-3; an Inf in
// rank 0's gradients only makes every rank skip the step and halve its
// scale, and on the 2 x 2 grid an Inf in one replica's rows every rank of
// both replicas.
#include <doctest/doctest.h>

#include <cstdio>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "data_parallel/data_parallel_util.h"
#include "engine/engine_test_util.h"
#include "mpi_test_util.h"
#include "pipeline/pipeline_precision_util.h"
#include "weft/error.h"
#include "weft/parallel/pipeline.h"

using namespace dp_test;
using weft::EngineConfig;
using weft_test::contains;

namespace {

// Balanced consecutive blocks of `layers` into `parts`.
std::vector<int> even_balance(int layers, int parts) {
  std::vector<int> out;
  for (int k = 0; k < parts; ++k) out.push_back(layers / parts + (k < layers % parts ? 1 : 0));
  return out;
}

// The largest |a - b| / max(1, |b|) over the parameters of layers [first, last).
double stage_diff(nn::Sequential& got, nn::Sequential& want, int first, int last) {
  double worst = 0;
  for (int i = first; i < last; ++i) {
    const auto g = got[static_cast<std::size_t>(i)].parameters();
    const auto w = want[static_cast<std::size_t>(i)].parameters();
    REQUIRE(g.size() == w.size());
    for (std::size_t j = 0; j < g.size(); ++j) {
      const std::vector<float> a = g[j]->value.to_host(), b = w[j]->value.to_host();
      REQUIRE(a.size() == b.size());
      for (std::size_t e = 0; e < a.size(); ++e)
        worst = std::max(worst, std::abs(static_cast<double>(a[e]) - b[e]) / std::max(1.0, std::abs(static_cast<double>(b[e]))));
    }
  }
  return worst;
}

Tensor rows_of(Engine& e, const Batch& b, std::int64_t begin, std::int64_t end) {
  const std::int64_t row = b.x_shape.numel() / b.x_shape[0];
  std::vector<std::int64_t> dims = b.x_shape.dims();
  dims[0] = end - begin;
  return Tensor::from_host(e, Shape(dims), std::vector<float>(b.x.begin() + begin * row, b.x.begin() + end * row));
}
Tensor labels_of(Engine& e, const Batch& b, std::int64_t begin, std::int64_t end) {
  return Tensor::from_host(e, Shape{end - begin}, std::vector<float>(b.y.begin() + begin, b.y.begin() + end));
}

// `steps` SGD steps through a pipeline over `ranks`, each replica on its
// share [begin, end) of every batch; checks the parameters of this rank's
// stages against `want` (one device, whole batches).
void check_pipelined(Engine& e, const ModelFn& make, const std::vector<Batch>& batches, par::PipelineOptions options,
                     nn::Sequential& want, std::int64_t begin, std::int64_t end, const std::string& what) {
  INFO(what);
  auto net = make(e, Device::cpu(0), 0);
  par::Pipeline pipe(e, *net, std::move(options));
  for (const Batch& b : batches) {
    const Tensor loss = pipe.train_step(rows_of(e, b, begin, end), labels_of(e, b, begin, end));
    CHECK(loss.defined() == pipe.is_local(pipe.stages() - 1));
    if (loss.defined()) CHECK(std::isfinite(loss.item()));
    pipe.step(0.1f);
  }
  for (int k = 0; k < pipe.stages(); ++k) {
    if (!pipe.is_local(k)) continue;
    const auto [first, last] = pipe.layers(k);
    CHECK(stage_diff(*net, want, first, last) < 1e-5);
  }
  e.wait_all();
}

std::unique_ptr<nn::Sequential> trained(Engine& e, const ModelFn& make, const std::vector<Batch>& batches) {
  auto net = make(e, Device::cpu(0), 0);
  for (const Batch& b : batches) {
    net->backward(weft::ops::softmax_cross_entropy(net->forward(rows_of(e, b, 0, b.x_shape[0])),
                                                   labels_of(e, b, 0, b.x_shape[0]))
                      .dlogits);
    nn::sgd_step(net->parameters(), 0.1f);
  }
  return net;
}

}  // namespace

TEST_CASE("distributed pipeline: every schedule across the ranks equals one device" * doctest::timeout(300)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .workers_per_cpu_device = 2});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int ranks = world.size();
  const std::vector<Batch> mlp = mlp_batches(2, 11);  // 11 rows: no chunk count here divides it
  const std::vector<Batch> lenet = lenet_batches(2, 8 * ranks + 1);
  auto want_mlp = trained(*e, mlp_model(), mlp);
  auto want_lenet = trained(*e, lenet_model(), lenet);
  const int mlp_layers = 5, lenet_layers = static_cast<int>(want_lenet->size());
  for (const char* schedule : {"gpipe", "1f1b", "zb-h1"})
    for (int chunks : {1, 2 * ranks + 1}) {  // 1: fewer micro-batches than stages
      const std::string what = std::string(schedule) + ", " + std::to_string(chunks) + " micro-batches";
      if (ranks <= mlp_layers)
        check_pipelined(*e, mlp_model(), mlp,
                        {.balance = even_balance(mlp_layers, ranks), .chunks = std::min(chunks, 11),
                         .checkpoint = chunks > 1 ? par::Checkpoint::except_last : par::Checkpoint::never,
                         .schedule = schedule, .ranks = world},
                        *want_mlp, 0, 11, "MLP, " + what);
      if (chunks > 1)
        check_pipelined(*e, lenet_model(), lenet,
                        {.balance = even_balance(lenet_layers, ranks), .chunks = chunks, .schedule = schedule,
                         .ranks = world},
                        *want_lenet, 0, lenet[0].x_shape[0], "LeNet, " + what);
    }
  // A schedule whose receiver takes its messages in another order than they
  // were sent (and its gradients likewise).
  if (ranks == 2)
    check_pipelined(*e, mlp_model(), mlp,
                    {.balance = {2, 3}, .chunks = 2,
                     .custom = [](int, int) {
                       return par::Schedule::parse(
                           "F0 S0 F1 S1 r1 B1 W1 r0 B0 W0\nR1 R0 F0 F1 B1 W1 s1 B0 W0 s0\n", "out of order");
                     },
                     .ranks = world},
                    *want_mlp, 0, 11, "MLP, receives out of their send order");
  // Interleaved: two chunks of LeNet per rank, micro-batches in groups of the ranks.
  if (2 * ranks <= lenet_layers)
    check_pipelined(*e, lenet_model(), lenet,
                    {.balance = even_balance(lenet_layers, 2 * ranks), .chunks = 2 * ranks, .virtual_stages = 2,
                     .schedule = "interleaved-1f1b", .ranks = world},
                    *want_lenet, 0, lenet[0].x_shape[0], "LeNet, interleaved-1f1b");
  mpi_test::sync_ranks(*e);
}

TEST_CASE("distributed pipeline: plans that differ fail on every rank naming both; bad plans are refused" *
          doctest::timeout(300)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int ranks = world.size(), me = world.local_ranks().front();
  auto net = mlp_model()(*e, Device::cpu(0), 0);
  if (ranks > 1) {
    // Rank 0 runs GPipe, the others 1F1B: each fails naming itself and a peer.
    const std::string mine = me == 0 ? "'gpipe'" : "'1f1b'";
    try {
      par::Pipeline pipe(*e, *net, {.balance = even_balance(5, ranks), .chunks = 4,
                                    .schedule = me == 0 ? "gpipe" : "1f1b", .ranks = world});
      FAIL("no error");
    } catch (const weft::CommunicationError& err) {
      CHECK(weft_test::contains(std::string(err.what()), "the plans of ranks"));
      CHECK(weft_test::contains(std::string(err.what()), "rank " + std::to_string(me) + " has " + mine));
      CHECK(weft_test::contains(std::string(err.what()), me == 0 ? "has '1f1b'" : "has 'gpipe'"));
    }
    // The same schedule, different micro-batch counts.
    try {
      par::Pipeline pipe(*e, *net, {.balance = even_balance(5, ranks), .chunks = me == 0 ? 3 : 4, .ranks = world});
      FAIL("no error");
    } catch (const weft::CommunicationError& err) {
      CHECK(weft_test::contains(std::string(err.what()), me == 0 ? "3 micro-batches" : "4 micro-batches"));
    }
  }
  // A schedule of one more stage than ranks; interleaving with fewer
  // micro-batches than stages; a balance of too few model stages.
  const std::string too_many = "has " + std::to_string(ranks + 1) + " stages, the pipeline " + std::to_string(ranks) + " ranks";
  CHECK_THROWS_WITH_AS(par::Pipeline(*e, *net, {.balance = even_balance(5, ranks), .chunks = 2,
                                                .custom = [](int k, int m) { return par::Schedule::gpipe(k + 1, m); },
                                                .ranks = world}),
                       doctest::Contains(too_many.c_str()), weft::InvalidArgument);
  auto lenet = lenet_model()(*e, Device::cpu(0), 0);
  if (ranks > 1 && 2 * ranks <= static_cast<int>(lenet->size()))
    CHECK_THROWS_WITH_AS(par::Pipeline(*e, *lenet, {.balance = even_balance(static_cast<int>(lenet->size()), 2 * ranks),
                                                    .chunks = 1, .virtual_stages = 2, .schedule = "interleaved-1f1b",
                                                    .ranks = world}),
                         doctest::Contains("interleaved-1f1b needs micro-batches in groups of the stages"),
                         weft::InvalidArgument);
  if (ranks > 1)
    CHECK_THROWS_WITH_AS(par::Pipeline(*e, *net, {.balance = {5}, .chunks = 2, .ranks = world}),
                         doctest::Contains("the balance has 1"), weft::InvalidArgument);
  mpi_test::sync_ranks(*e);
}

TEST_CASE("distributed pipeline: a rank that stalls mid-step fails the others at the deadline, naming a quiet neighbour" *
          doctest::timeout(300)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0), {.timeout = std::chrono::seconds(2)});
  const int ranks = world.size(), me = world.local_ranks().front();
  if (mpi_test::alone(ranks)) return;
  auto net = mlp_model()(*e, Device::cpu(0), 0);
  const std::vector<Batch> batches = mlp_batches(1, 8);
  par::Pipeline pipe(*e, *net, {.balance = even_balance(5, ranks), .chunks = 4, .schedule = "1f1b", .ranks = world});
  const int stalled = 1;
  if (me != stalled) {
    const auto t0 = std::chrono::steady_clock::now();
    (void)pipe.train_step(rows_of(*e, batches[0], 0, 8), labels_of(*e, batches[0], 0, 8));
    std::string error = "(no error)";
    try {
      e->wait_all();
    } catch (const weft::Error& err) {
      error = err.what();
    }
    // Each survivor names a neighbour that went quiet: the stalled rank, or
    // one that waits for it in turn (a member's receives from both sides
    // reach their deadlines together, and either may be reported). A member
    // whose only neighbour is the stalled rank names it.
    INFO(error);
    CHECK(weft_test::contains(error, "within 2 s"));
    const auto names = [&](int peer) {
      const std::string rank = "rank " + std::to_string(peer) + " ";
      return weft_test::contains(error, rank + "sent nothing") || weft_test::contains(error, rank + "did not receive");
    };
    std::vector<int> neighbours;
    if (me > 0) neighbours.push_back(me - 1);
    if (me + 1 < ranks) neighbours.push_back(me + 1);
    CHECK(std::ranges::any_of(neighbours, names));
    if (neighbours == std::vector<int>{stalled}) CHECK(names(stalled));
    CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60));
  }
  mpi_test::sync_ranks(*e);
}

TEST_CASE("distributed pipeline x data parallel: 2 stages x 2 replicas equal one device on the whole batch" *
          doctest::timeout(300)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .workers_per_cpu_device = 2});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  if (world.size() != 4) {
    std::printf("[weft-skip] %d rank(s): this case is a 2 x 2 grid of four (ctest runs it at np4)\n", world.size());
    return;
  }
  const int me = world.local_ranks().front();
  const int replica = me / 2;
  // Ranks 0, 1 are replica 0's stages 0, 1; ranks 2, 3 replica 1's.
  const par::Communicator pipeline_ranks = world.split({0, 0, 1, 1});
  const par::Communicator replicas = world.split({0, 1, 0, 1});
  CHECK(pipeline_ranks.size() == 2);
  CHECK(replicas.size() == 2);
  for (const ModelFn& make : {mlp_model(), lenet_model()}) {
    const bool is_mlp = make(*e, Device::cpu(0), 0)->size() == 5;
    const std::vector<Batch> batches = is_mlp ? mlp_batches(2, 12) : lenet_batches(2, 16);
    auto want = trained(*e, make, batches);
    const std::int64_t half = batches[0].x_shape[0] / 2;
    for (const char* schedule : {"1f1b", "zb-h1"})
      check_pipelined(*e, make, batches,
                      {.balance = even_balance(static_cast<int>(want->size()), 2), .chunks = 3, .schedule = schedule,
                       .ranks = pipeline_ranks, .replicas = replicas, .bucket_bytes = 2000},
                      *want, replica * half, (replica + 1) * half,
                      std::string(is_mlp ? "MLP, " : "LeNet, ") + schedule + ", replica " + std::to_string(replica));
  }
  mpi_test::sync_ranks(*e);
}

// ---- precision --------------------------------------------------------------

TEST_CASE("distributed pipeline: bf16 and fp16 with loss scaling equal one device in the same precision" *
          doctest::timeout(300)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded", .workers_per_cpu_device = 2});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int ranks = world.size();
  if (ranks > 5) {
    std::printf("[weft-skip] %d ranks: the MLP has 5 layers\n", ranks);
    return;
  }
  const std::vector<Batch> batches = mlp_batches(3, 12);
  for (weft::Precision p : {weft::Precision::bf16, weft::Precision::fp16}) {
    const std::optional<par::LossScaling> ls =
        p == weft::Precision::fp16 ? std::optional<par::LossScaling>(par::LossScaling{.init_scale = 1024.0f}) : std::nullopt;
    const pipe_precision::Trained want = pipe_precision::train_one_device(*e, mlp_model(), batches, p, ls, 0.1f);
    for (const char* schedule : {"gpipe", "zb-h1"}) {
      const std::string what = std::string(weft::to_string(p)) + ", " + schedule;
        INFO(what);
      auto net = mlp_model()(*e, Device::cpu(0), 0);
      par::Pipeline pipe(*e, *net, {.balance = even_balance(5, ranks), .chunks = 4, .schedule = schedule, .ranks = world,
                                    .precision = p, .loss_scaling = ls});
      for (const Batch& b : batches) {
        const Tensor loss = pipe.train_step(rows_of(*e, b, 0, 12), labels_of(*e, b, 0, 12));
        if (loss.defined()) CHECK(std::isfinite(loss.item()));
        pipe.step(0.1f);
      }
      for (int k = 0; k < pipe.stages(); ++k) {
        if (!pipe.is_local(k)) continue;
        const auto [first, last] = pipe.layers(k);
        CHECK(stage_diff(*net, *want.net, first, last) < 1e-3);
      }
      CHECK(pipe.loss_scale() == want.scale);
      CHECK(pipe.skipped_steps() == want.skipped);
      e->wait_all();
    }
  }
  mpi_test::sync_ranks(*e);
}

TEST_CASE("distributed pipeline: an Inf on one rank's stage makes every rank skip the step and back off alike" *
          doctest::timeout(300)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  const int ranks = world.size(), me = world.local_ranks().front();
  if (mpi_test::alone(ranks)) return;
  if (ranks > 5) {
    std::printf("[weft-skip] %d ranks: the MLP has 5 layers\n", ranks);
    return;
  }
  auto net = mlp_model()(*e, Device::cpu(0), 0);
  pipe_precision::zero_first_column(*net);
  par::Pipeline pipe(*e, *net, {.balance = even_balance(5, ranks), .chunks = 3, .schedule = "1f1b", .ranks = world,
                                .loss_scaling = par::LossScaling{.init_scale = 65536.0f}});
  const std::vector<std::vector<float>> before = values_of(*net);
  const Batch bad = pipe_precision::overflowing_batch(6);
  (void)pipe.train_step(rows_of(*e, bad, 0, 6), labels_of(*e, bad, 0, 6));
  // Only rank 0 (the first layer's weight gradient) holds an Inf.
  bool finite = true;
  for (nn::Parameter* p : net->parameters())
    if (p->grad.defined())
      for (float v : p->grad.to_host()) finite = finite && std::isfinite(v);
  CHECK(finite == (me != 0));
  pipe.step(0.1f);
  CHECK(values_of(*net) == before);  // every rank skipped
  CHECK(pipe.loss_scale() == 32768.0f);
  CHECK(pipe.skipped_steps() == 1);
  // A clean batch: every rank updates, the scale holds.
  const Batch good = random_batch(6, {20}, 5, 5);
  (void)pipe.train_step(rows_of(*e, good, 0, 6), labels_of(*e, good, 0, 6));
  pipe.step(0.1f);
  // (A rank whose stage is a ReLU has nothing to update.)
  bool has_parameters = false;
  for (int k = 0; k < pipe.stages(); ++k)
    for (int i = pipe.layers(k).first; pipe.is_local(k) && i < pipe.layers(k).second; ++i)
      has_parameters = has_parameters || !(*net)[static_cast<std::size_t>(i)].parameters().empty();
  CHECK((values_of(*net) != before) == has_parameters);
  CHECK(pipe.loss_scale() == 32768.0f);
  CHECK(pipe.skipped_steps() == 1);
  e->wait_all();
  mpi_test::sync_ranks(*e);
}

TEST_CASE("distributed pipeline x data parallel: an Inf in one replica's first stage makes all four ranks skip alike" *
          doctest::timeout(300)) {
  auto e = Engine::create(EngineConfig{.kind = "threaded"});
  const par::Communicator world = par::Communicator::mpi(*e, Device::cpu(0));
  if (world.size() != 4) {
    std::printf("[weft-skip] %d rank(s): this case is a 2 x 2 grid of four (ctest runs it at np4)\n", world.size());
    return;
  }
  const int me = world.local_ranks().front();
  const int replica = me / 2;
  const par::Communicator pipeline_ranks = world.split({0, 0, 1, 1});
  const par::Communicator replicas = world.split({0, 1, 0, 1});
  auto net = mlp_model()(*e, Device::cpu(0), 0);
  pipe_precision::zero_first_column(*net);
  par::Pipeline pipe(*e, *net, {.balance = {2, 3}, .chunks = 3, .schedule = "zb-h1", .ranks = pipeline_ranks,
                                .replicas = replicas, .loss_scaling = par::LossScaling{.init_scale = 65536.0f}});
  const std::vector<std::vector<float>> before = values_of(*net);
  // Replica 0 trains on the overflowing rows, replica 1 on clean ones.
  const Batch b = replica == 0 ? pipe_precision::overflowing_batch(6) : random_batch(6, {20}, 5, 5);
  (void)pipe.train_step(rows_of(*e, b, 0, 6), labels_of(*e, b, 0, 6));
  pipe.step(0.1f);
  CHECK(values_of(*net) == before);  // every rank of both replicas skipped
  CHECK(pipe.loss_scale() == 32768.0f);
  CHECK(pipe.skipped_steps() == 1);
  const Batch good = random_batch(6, {20}, 5, 7 + static_cast<std::uint64_t>(replica));
  (void)pipe.train_step(rows_of(*e, good, 0, 6), labels_of(*e, good, 0, 6));
  pipe.step(0.1f);
  CHECK(values_of(*net) != before);
  CHECK(pipe.loss_scale() == 32768.0f);
  CHECK(pipe.skipped_steps() == 1);
  e->wait_all();
  mpi_test::sync_ranks(*e);
}
