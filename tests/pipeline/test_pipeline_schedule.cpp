// Pipeline schedules as data: GPipe, 1F1B, ZB-H1 and interleaved 1F1B lists
// validate for 1-8 stages (fewer micro-batches than stages run, or are
// refused by name for interleaved 1F1B), the micro-batches each rank keeps,
// each schedule's bubble at unit times equal to its theory (and to
// predicted_bubble), ZB-H1 at 1F1B's peak with under 0.42x its bubble, broken
// lists (missing, repeated, out-of-order actions, chunks, deadlocks) as
// errors naming rank, chunk, action and micro-batch, and schedules read from
// text and files (describe()'s format round trip, transfers inserted,
// errors naming the line and token, or the file).
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "weft/error.h"
#include "weft/parallel/metrics.h"
#include "weft/parallel/pipeline.h"

namespace par = weft::parallel;
using par::Action;
using par::ActionKind;
using par::Schedule;

namespace {

const std::vector<int> kStageCounts = {1, 2, 3, 4, 8};

// The micro-batch counts tried with k stages: 1, 2, 3, K, 2K and 4K.
std::vector<int> micro_batch_counts(int k) {
  std::vector<int> out = {1, 2, 3, k, 2 * k, 4 * k};
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// A schedule's lists without their transfers (what a hand-written file may list).
std::string compute_only(const Schedule& s) {
  std::string out;
  for (std::size_t k = 0; k < s.stages.size(); ++k) {
    out += "stage " + std::to_string(k) + ":";
    for (const Action& a : s.stages[k]) {
      if (a.kind != ActionKind::forward && a.kind != ActionKind::backward_input && a.kind != ActionKind::backward_weight)
        continue;
      out.append(a.kind == ActionKind::forward ? " F" : a.kind == ActionKind::backward_input ? " B" : " W");
      out.append(std::to_string(a.micro_batch));
      if (s.virtual_stages > 1) out.append(":").append(std::to_string(a.chunk));
    }
    out += "\n";
  }
  return out;
}

void check_same(const Schedule& got, const Schedule& want) {
  CHECK(got.name == want.name);
  CHECK(got.virtual_stages == want.virtual_stages);
  CHECK(got.stages == want.stages);
}

}  // namespace

TEST_CASE("pipeline schedules: gpipe and 1f1b lists validate and keep M or K - k micro-batches") {
  for (int k_count = 1; k_count <= 4; ++k_count)
    for (int m = 1; m <= 9; ++m) {
      CAPTURE(k_count);
      CAPTURE(m);
      const par::Schedule g = par::Schedule::gpipe(k_count, m);
      const par::Schedule f = par::Schedule::one_f_one_b(k_count, m);
      CHECK_NOTHROW(g.validate(m));
      CHECK_NOTHROW(f.validate(m));
      const std::vector<int> gp = g.peak_in_flight(), fp = f.peak_in_flight();
      for (int k = 0; k < k_count; ++k) {
        CHECK(gp[static_cast<std::size_t>(k)] == m);
        CHECK(fp[static_cast<std::size_t>(k)] == std::min(k_count - k, m));
      }
    }
  // A whole backward: the input gradient, the weight gradient, then the send.
  CHECK(par::Schedule::gpipe(2, 2).describe() ==
        "stage 0: F0 S0 F1 S1 r1 B1 W1 r0 B0 W0\n"
        "stage 1: R0 F0 R1 F1 B1 W1 s1 B0 W0 s0");
  CHECK(par::Schedule::one_f_one_b(2, 3).describe() ==
        "stage 0: F0 S0 F1 S1 r0 B0 W0 F2 S2 r1 B1 W1 r2 B2 W2\n"
        "stage 1: R0 F0 B0 W0 s0 R1 F1 B1 W1 s1 R2 F2 B2 W2 s2");
  CHECK(par::Schedule::named("1f1b", 3, 4).name == "1f1b");
  CHECK(par::Schedule::named("one_f_one_b", 3, 4).name == "1f1b");
  CHECK_THROWS_WITH_AS(par::Schedule::named("zigzag", 3, 4), doctest::Contains("unknown schedule 'zigzag'"),
                       weft::InvalidArgument);
}

TEST_CASE("pipeline schedules: broken lists are named errors, a deadlock too") {
  par::Schedule s = par::Schedule::gpipe(2, 2);
  SUBCASE("a missing forward") {
    auto& l = s.stages[1];
    l.erase(std::find(l.begin(), l.end(), Action{ActionKind::forward, 1}));
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("stage 1 has no forward of micro-batch 1"),
                         weft::InvalidArgument);
  }
  SUBCASE("a backward before its forward") {
    auto& l = s.stages[0];
    std::rotate(l.begin(), l.begin() + 6, l.end());  // W1 r0 B0 W0 ... first
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("before its forward"), weft::InvalidArgument);
  }
  SUBCASE("a repeated action") {
    s.stages[0].push_back(Action{ActionKind::backward_weight, 0});
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("repeats action"), weft::InvalidArgument);
  }
  SUBCASE("a deadlock: stage 1 waits for micro-batch 1 before stage 0 sends it") {
    // Stage 0 keeps micro-batch 1's forward until after micro-batch 0's
    // backward, whose gradient stage 1 sends only after its own forward of
    // micro-batch 1: each waits for the other.
    s.stages[0] = {{ActionKind::forward, 0}, {ActionKind::send_activation, 0}, {ActionKind::recv_grad, 0},
                   {ActionKind::backward_input, 0}, {ActionKind::backward_weight, 0}, {ActionKind::forward, 1},
                   {ActionKind::send_activation, 1}, {ActionKind::recv_grad, 1}, {ActionKind::backward_input, 1},
                   {ActionKind::backward_weight, 1}};
    s.stages[1] = {{ActionKind::recv_activation, 0}, {ActionKind::forward, 0}, {ActionKind::recv_activation, 1},
                   {ActionKind::forward, 1}, {ActionKind::backward_input, 0}, {ActionKind::send_grad, 0},
                   {ActionKind::backward_weight, 0}, {ActionKind::backward_input, 1}, {ActionKind::send_grad, 1},
                   {ActionKind::backward_weight, 1}};
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("deadlocks"), weft::InvalidArgument);
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("recv_grad of micro-batch 0) waits forever"),
                         weft::InvalidArgument);
  }
  SUBCASE("a receive on the first stage") {
    s.stages[0].insert(s.stages[0].begin(), Action{ActionKind::recv_activation, 0});
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("the first stage has no neighbour"), weft::InvalidArgument);
  }
  SUBCASE("bubble() validates first") {
    s.stages[1].pop_back();  // micro-batch 0's send_grad
    CHECK_THROWS_WITH_AS(s.bubble(), doctest::Contains("stage 1 has no send_grad of micro-batch 0"),
                         weft::InvalidArgument);
    s.stages[0][0].micro_batch = 1000000000;
    CHECK_THROWS_WITH_AS(s.bubble(),
                         doctest::Contains("stage 0 action 0 (forward of micro-batch 1000000000): no such micro-batch "
                                           "(the lists hold 19 actions)"),
                         weft::InvalidArgument);
  }
}

TEST_CASE("pipeline schedules: every built-in schedule validates on 1-8 stages, fewer micro-batches than stages too") {
  for (int k : kStageCounts)
    for (int m : micro_batch_counts(k)) {
      CAPTURE(k);
      CAPTURE(m);
      for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
        CAPTURE(name);
        const Schedule s = Schedule::named(name, k, m);
        CHECK(s.name == name);
        CHECK(s.ranks() == k);
        CHECK(s.virtual_stages == 1);
        CHECK_NOTHROW(s.validate(m));
        CHECK(s.bubble() >= 0);
      }
      for (int v : {1, 2, 4}) {
        CAPTURE(v);
        if (m % k == 0) {
          const Schedule s = Schedule::named("interleaved-1f1b", k, m, v);
          CHECK(s.name == "interleaved-1f1b");
          CHECK(s.ranks() == k);
          CHECK(s.model_stages() == k * v);
          CHECK_NOTHROW(s.validate(m));
        } else {
          CHECK_THROWS_WITH_AS(
              Schedule::named("interleaved-1f1b", k, m, v),
              doctest::Contains(("interleaved-1f1b needs micro-batches in groups of the stages: " + std::to_string(m) +
                                 " micro-batches on " + std::to_string(k) + " stages")
                                    .c_str()),
              weft::InvalidArgument);
        }
      }
    }
  // ZB-H1: the input gradient sent at once, stage k's weight gradients k
  // micro-batches later.
  CHECK(Schedule::zb_h1(2, 2).describe() ==
        "stage 0: F0 S0 F1 S1 r0 B0 W0 r1 B1 W1\n"
        "stage 1: R0 F0 B0 s0 R1 F1 B1 s1 W0 W1");
  // Interleaved: chunk c of rank d is model stage 2c + d; the last model
  // stage (chunk 1 of rank 1) sends nothing on.
  CHECK(Schedule::interleaved_1f1b(2, 2, 2).describe() ==
        "stage 0: F0:0 S0:0 F1:0 S1:0 R0:1 F0:1 S0:1 R1:1 F1:1 S1:1 r0:1 B0:1 W0:1 s0:1 r1:1 B1:1 W1:1 s1:1 "
        "r0:0 B0:0 W0:0 r1:0 B1:0 W1:0\n"
        "stage 1: R0:0 F0:0 S0:0 R1:0 F1:0 S1:0 R0:1 F0:1 B0:1 W0:1 s0:1 R1:1 F1:1 B1:1 W1:1 s1:1 "
        "r0:0 B0:0 W0:0 s0:0 r1:0 B1:0 W1:0 s1:0");
  CHECK_THROWS_WITH_AS(Schedule::named("gpipe", 2, 2, 2), doctest::Contains("'gpipe' runs one model chunk per stage"),
                       weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(Schedule::named("zb-h1", 2, 2, 0), doctest::Contains("'zb-h1' runs one model chunk per stage"),
                       weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(Schedule::named("interleaved-1f1b", 2, 2, 0),
                       doctest::Contains("need at least one virtual stage per rank, got 0"), weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(Schedule::named("zigzag", 2, 2),
                       doctest::Contains("unknown schedule 'zigzag' (known: gpipe, 1f1b, one_f_one_b, zb-h1, "
                                         "interleaved-1f1b)"),
                       weft::InvalidArgument);
}

TEST_CASE("pipeline schedules: each built-in schedule's bubble at unit times equals its theory") {
  // Forward, input gradient and weight gradient 1 each: gpipe and 1f1b
  // (K-1)/(M+K-1), zb-h1 (K-1)/(3M+K-1), interleaved (K-1)/(vM+K-1).
  for (int k : kStageCounts)
    for (int m : {k, 2 * k, 4 * k}) {
      CAPTURE(k);
      CAPTURE(m);
      const double kd = k, md = m;
      CHECK(std::abs(Schedule::gpipe(k, m).bubble() - (kd - 1) / (md + kd - 1)) < 1e-9);
      CHECK(std::abs(Schedule::one_f_one_b(k, m).bubble() - (kd - 1) / (md + kd - 1)) < 1e-9);
      CHECK(std::abs(Schedule::zb_h1(k, m).bubble() - (kd - 1) / (3 * md + kd - 1)) < 1e-9);
      for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
        CAPTURE(name);
        CHECK(std::abs(Schedule::named(name, k, m).bubble() - par::predicted_bubble(name, k, m)) < 1e-9);
      }
      for (int v : {2, 4}) {
        CAPTURE(v);
        const double b = Schedule::interleaved_1f1b(k, m, v).bubble();
        CHECK(std::abs(b - (kd - 1) / (v * md + kd - 1)) < 1e-9);
        CHECK(std::abs(b - par::predicted_bubble("interleaved-1f1b", k, m, v)) < 1e-9);
      }
    }
  CHECK(par::predicted_bubble("gpipe", 4, 8) == par::predicted_bubble(4, 8));
  CHECK(par::predicted_bubble("one_f_one_b", 4, 8) == par::predicted_bubble(4, 8));
  CHECK(std::abs(par::predicted_bubble("zb-h1", 4, 8) - 3.0 / 27) < 1e-12);
  CHECK(std::abs(par::predicted_bubble("interleaved-1f1b", 4, 8, 2) - 3.0 / 19) < 1e-12);
  CHECK_THROWS_WITH_AS(par::predicted_bubble("zigzag", 4, 8), doctest::Contains("unknown schedule 'zigzag'"),
                       weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::predicted_bubble("1f1b", 4, 8, 2), doctest::Contains("'1f1b' runs one model chunk"),
                       weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(par::predicted_bubble("gpipe", 0, 8), doctest::Contains("0 stages"), weft::InvalidArgument);
  // Times per action kind: a weight gradient twice as long as the others
  // on one stage leaves no bubble.
  CHECK(Schedule::gpipe(1, 3).bubble(1, 1, 2) == 0);
  CHECK_THROWS_WITH_AS(Schedule::gpipe(2, 2).bubble(1, -1, 1), doctest::Contains("the backward_input time is -1"),
                       weft::InvalidArgument);
}

TEST_CASE("pipeline schedules: zb-h1 keeps 1F1B's peak and leaves under 0.42x its bubble at M = 2K") {
  for (int k : kStageCounts)
    for (int m : micro_batch_counts(k)) {
      CAPTURE(k);
      CAPTURE(m);
      const std::vector<int> zb = Schedule::zb_h1(k, m).peak_in_flight();
      const std::vector<int> ofob = Schedule::one_f_one_b(k, m).peak_in_flight();
      for (int d = 0; d < k; ++d) CHECK(zb[static_cast<std::size_t>(d)] == std::min(k, m));
      CHECK(*std::max_element(zb.begin(), zb.end()) == *std::max_element(ofob.begin(), ofob.end()));
    }
  for (int k : {2, 3, 4, 8}) {
    CAPTURE(k);
    // Theory: (K-1)/(6K+K-1) over (K-1)/(2K+K-1) = (3K-1)/(7K-1): 11/27 (0.41)
    // at K = 4, 23/55 (0.418) at K = 8.
    const double zb = Schedule::zb_h1(k, 2 * k).bubble(), ofob = Schedule::one_f_one_b(k, 2 * k).bubble();
    CHECK(zb <= 0.42 * ofob);
    CHECK(zb > 0);
  }
  // Interleaving keeps more micro-batches alive: rank 0 of 4 with 2 chunks
  // at 8 micro-batches holds its warm-up's 10 forwards plus one.
  const std::vector<int> inter = Schedule::interleaved_1f1b(4, 8, 2).peak_in_flight();
  CHECK(inter[0] == 11);
  CHECK(inter[3] == 5);
}

TEST_CASE("pipeline schedules: chunks are named in errors, one rank sends to itself") {
  Schedule s = Schedule::interleaved_1f1b(2, 2, 2);
  SUBCASE("a missing forward of chunk 1") {
    auto& l = s.stages[0];
    l.erase(std::find(l.begin(), l.end(), Action{ActionKind::forward, 1, 1}));
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("stage 0 chunk 1 has no forward of micro-batch 1"),
                         weft::InvalidArgument);
  }
  SUBCASE("a chunk outside the virtual stages") {
    s.stages[1][0].chunk = 2;
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("stage 1 chunk 2 action 0 (recv_activation of micro-batch 0): "
                                                          "no such chunk (2 per stage)"),
                         weft::InvalidArgument);
  }
  SUBCASE("the last model stage sends nothing on") {
    s.stages[1].push_back(Action{ActionKind::send_activation, 0, 1});
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("the last model stage has no neighbour there"),
                         weft::InvalidArgument);
  }
  SUBCASE("one rank, two chunks: a receive before its own send deadlocks") {
    Schedule one = Schedule::interleaved_1f1b(1, 1, 2);
    CHECK(one.describe() == "stage 0: F0:0 S0:0 R0:1 F0:1 B0:1 W0:1 s0:1 r0:0 B0:0 W0:0");
    CHECK_NOTHROW(one.validate(1));
    CHECK(one.bubble() == 0);
    std::rotate(one.stages[0].begin(), one.stages[0].begin() + 2, one.stages[0].begin() + 4);  // R0:1 F0:1 first
    CHECK_THROWS_WITH_AS(one.validate(1),
                         doctest::Contains("the schedule deadlocks: stage 0 chunk 1 action 0 (recv_activation of "
                                           "micro-batch 0) waits forever"),
                         weft::InvalidArgument);
  }
}

TEST_CASE("pipeline schedules: text round trip, transfers inserted, errors naming the line and token") {
  SUBCASE("parse(describe()) gives every built-in schedule back") {
    for (int k : {1, 2, 3, 4})
      for (int m : {1, 3, 2 * k}) {
        CAPTURE(k);
        CAPTURE(m);
        for (const char* name : {"gpipe", "1f1b", "zb-h1"}) {
          const Schedule s = Schedule::named(name, k, m);
          check_same(Schedule::parse(s.describe(), name), s);
        }
        if (m % k == 0)
          for (int v : {2, 3}) {
            const Schedule s = Schedule::interleaved_1f1b(k, m, v);
            check_same(Schedule::parse(s.describe(), s.name), s);
          }
      }
  }
  SUBCASE("commas, comments, blank lines, no stage prefixes") {
    const Schedule s = Schedule::parse(
        "# two stages, one micro-batch\n"
        "\n"
        "F0, S0, r0, B0, W0   # stage 0\n"
        "  R0 F0,B0 s0 W0\n",
        "mine");
    CHECK(s.name == "mine");
    CHECK(s.describe() == "stage 0: F0 S0 r0 B0 W0\nstage 1: R0 F0 B0 s0 W0");
    CHECK_NOTHROW(s.validate(1));
  }
  SUBCASE("compute actions only: the transfers are inserted") {
    // ZB-H1's lists are what the insertion gives: R before a forward, S
    // after it, r before an input gradient, s after it.
    for (int k : {1, 2, 4}) {
      CAPTURE(k);
      const Schedule zb = Schedule::zb_h1(k, 2 * k);
      Schedule got = Schedule::parse(compute_only(zb), "zb-h1");
      check_same(got, zb);
      const Schedule inter = Schedule::interleaved_1f1b(k, 2 * k, 2);
      got = Schedule::parse(compute_only(inter), "mine");
      CHECK(got.virtual_stages == 2);
      CHECK_NOTHROW(got.validate(2 * k));
    }
  }
  SUBCASE("an unreadable token") {
    CHECK_THROWS_WITH_AS(Schedule::parse("F0 B0 W0\nF0 X1 B0\n", "bad"),
                         doctest::Contains("schedule 'bad': line 2: cannot read 'X1'"), weft::InvalidArgument);
    CHECK_THROWS_WITH_AS(Schedule::parse("F0 B0: W0", "bad"), doctest::Contains("line 1: cannot read 'B0:'"),
                         weft::InvalidArgument);
    CHECK_THROWS_WITH_AS(Schedule::parse("F0 B W0", "bad"), doctest::Contains("line 1: cannot read 'B'"),
                         weft::InvalidArgument);
    CHECK_THROWS_WITH_AS(Schedule::parse("# nothing\n\n", "bad"), doctest::Contains("schedule 'bad': no stages"),
                         weft::InvalidArgument);
  }
  SUBCASE("a bad stage prefix") {
    CHECK_THROWS_WITH_AS(Schedule::parse("stage 0: F0 B0 W0\nstage 2: F0 B0 W0\n", "bad"),
                         doctest::Contains("line 2: 'stage 2:' where stage 1 was expected"), weft::InvalidArgument);
    CHECK_THROWS_WITH_AS(Schedule::parse("\nstage one: F0 B0 W0\n", "bad"),
                         doctest::Contains("line 2: cannot read 'stage one:'"), weft::InvalidArgument);
  }
  SUBCASE("a missing action") {
    const Schedule s = Schedule::parse("stage 0: F0 B0 W0 F1 B1\nstage 1: F0 B0 W0 F1 B1 W1", "short");
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("short: stage 0 has no backward_weight of micro-batch 1"),
                         weft::InvalidArgument);
  }
  SUBCASE("a repeated action") {
    const Schedule s = Schedule::parse("stage 0: F0 B0 W0 W0\nstage 1: F0 B0 W0", "twice");
    CHECK_THROWS_WITH_AS(s.validate(1),
                         doctest::Contains("twice: stage 0 action 5 (backward_weight of micro-batch 0) repeats action 4"),
                         weft::InvalidArgument);
  }
  SUBCASE("a deadlocked file") {
    // Stage 0 waits for micro-batch 0's gradient before it sends micro-batch
    // 1; stage 1 runs micro-batch 1's forward before micro-batch 0's backward.
    const Schedule s = Schedule::parse("stage 0: F0 B0 W0 F1 B1 W1\nstage 1: F0 F1 B0 W0 B1 W1", "stuck");
    CHECK_THROWS_WITH_AS(s.validate(2), doctest::Contains("stuck: the schedule deadlocks: stage 0 action 2 (recv_grad "
                                                          "of micro-batch 0) waits forever; stage 1 action 2 "
                                                          "(recv_activation of micro-batch 1) waits forever"),
                         weft::InvalidArgument);
  }
}

TEST_CASE("pipeline schedules: from_file reads a file named by its stem, or names the path it cannot read") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("weft-schedule-" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const fs::path file = dir / "zb-mine.txt";
  {
    std::ofstream out(file);
    out << compute_only(Schedule::zb_h1(3, 6));
  }
  const Schedule s = Schedule::from_file(file.string());
  CHECK(s.name == "zb-mine");
  CHECK(s.stages == Schedule::zb_h1(3, 6).stages);
  CHECK_NOTHROW(s.validate(6));
  {
    std::ofstream out(file);
    out << "stage 0: F0 B0 W0\nstage 1: F0 Q0\n";
  }
  CHECK_THROWS_WITH_AS(Schedule::from_file(file.string()),
                       doctest::Contains(("schedule file '" + file.string() + "': line 2: cannot read 'Q0'").c_str()),
                       weft::InvalidArgument);
  const std::string missing = (dir / "no-such-schedule.txt").string();
  CHECK_THROWS_WITH_AS(Schedule::from_file(missing), doctest::Contains(("cannot read '" + missing + "'").c_str()),
                       weft::InvalidArgument);
  CHECK_THROWS_WITH_AS(Schedule::from_file(dir.string()), doctest::Contains(("cannot read '" + dir.string() + "'").c_str()),
                       weft::InvalidArgument);
  fs::remove_all(dir);
}
