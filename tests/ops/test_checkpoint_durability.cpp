// Checkpoints that no crash can break: a writer killed at every point of a
// save (weft-test-checkpoint-crash, SIGKILL at a crash point) leaves
// `latest` naming a complete checkpoint, the previous or the new one, and
// retention never deletes what `latest` names; the run directory's lock;
// headers and indexes that are ambiguous or mixed up are refused, naming
// the file and the key; loads read the files they validated.
// docs/design/checkpoints.md, "Surviving crashes".
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "weft/checkpoint.h"
#include "weft/engine.h"
#include "weft/error.h"
#include "weft/tensor.h"

#ifndef WEFT_CHECKPOINT_CRASH
#error "WEFT_CHECKPOINT_CRASH: the path of weft-test-checkpoint-crash"
#endif

namespace {

namespace fs = std::filesystem;
namespace ckpt = weft::checkpoint;
using weft::Engine;
using weft::Shape;
using weft::Tensor;

struct DurTmpDir {
  fs::path path;
  explicit DurTmpDir(const std::string& tag) {
    static std::atomic<int> counter{0};
    path = fs::temp_directory_path() /
           ("weft-ckpt-dur-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~DurTmpDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Runs the crash helper with `args`; its wait status.
// (The child only calls async-signal-safe functions: the test binary runs
// threads, so its argv is made before the fork.)
int dur_run(const std::vector<std::string>& args) {
  std::string exe = WEFT_CHECKPOINT_CRASH;
  std::vector<std::string> copy = args;
  std::vector<char*> argv{exe.data()};
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::execv(exe.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return status;
}

bool dur_killed(int status) { return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL; }
bool dur_ok(int status) { return WIFEXITED(status) && WEXITSTATUS(status) == 0; }

void dur_save(const fs::path& run, int step, int ranks, int keep, const std::string& point = "-", int nth = 1) {
  const int status = dur_run({"save", run.string(), std::to_string(step), std::to_string(ranks), std::to_string(keep),
                              point, std::to_string(nth)});
  if (point == "-")
    REQUIRE_MESSAGE(dur_ok(status), "saving step " << step << " failed: status " << status);
  else
    REQUIRE_MESSAGE(dur_killed(status), "the save of step " << step << " was not killed at " << point << " #" << nth
                                                            << " (status " << status << ")");
}

// Loads `dir` whole; the step every element came from (they must agree:
// never a mix of two saves).
int dur_loaded_step(Engine& engine, const fs::path& dir) {
  const ckpt::Reader reader = ckpt::Reader::open(dir);
  Tensor w = Tensor::zeros(engine, Shape{10, 10});
  Tensor m = Tensor::zeros(engine, Shape{3});
  ckpt::load(reader, {{"w", w}, {"m", m}});
  const std::vector<float> wv = w.to_host(), mv = m.to_host();
  const int step = static_cast<int>(wv[0]) / 1000;
  for (std::size_t i = 0; i < wv.size(); ++i) REQUIRE(wv[i] == static_cast<float>(step * 1000 + static_cast<int>(i)));
  for (std::size_t i = 0; i < mv.size(); ++i) REQUIRE(mv[i] == static_cast<float>(step * 1000 + static_cast<int>(i)));
  CHECK(reader.metadata().at("step") == std::to_string(step));
  return step;
}

std::set<std::string> dur_entries(const fs::path& dir) {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::string dur_step_name(int step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08d", step);
  return name;
}

void dur_expect_invalid(const std::function<void()>& fn, std::initializer_list<std::string> parts) {
  try {
    fn();
    FAIL_CHECK("no weft::InvalidArgument thrown (wanted one naming " << *parts.begin() << ")");
  } catch (const weft::InvalidArgument& e) {
    const std::string what = e.what();
    for (const std::string& p : parts) CHECK_MESSAGE(what.find(p) != std::string::npos, what << "\n  lacks: " << p);
  }
}

std::string dur_read(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
void dur_write(const fs::path& p, const std::string& s) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << s;
}

// Every crash point of a save by two writers, in order ("file-synced" and
// "file-renamed" come once per file: rank 1's shard, rank 0's, the index).
const std::vector<std::pair<std::string, int>> kDurPoints = {
    {"file-synced", 1},    {"file-renamed", 1},     {"file-synced", 2},    {"file-renamed", 2},
    {"shards-durable", 1}, {"file-synced", 3},      {"file-renamed", 3},   {"dir-renamed", 1},
    {"committed", 1},      {"latest-link-made", 1}, {"latest-swapped", 1}, {"retention-one", 1}};

}  // namespace

TEST_CASE("checkpoint durability - a writer killed at every point of a save leaves latest whole" *
          doctest::timeout(120)) {
  auto engine = Engine::create({.kind = "threaded", .cpu_devices = 1});
  const int keep = 2;
  for (const auto& [point, nth] : kDurPoints) {
    INFO("killed at " << point << " #" << nth);
    DurTmpDir tmp("crash");
    const fs::path run = tmp.path / "run";
    for (int step = 1; step <= 3; ++step) dur_save(run, step, 2, keep);
    CHECK_FALSE(fs::exists(run / dur_step_name(1)));  // retention: the newest 2
    dur_save(run, 4, 2, keep, point, nth);
    // latest: the previous checkpoint or the new one, whole, never a mix.
    const int step = dur_loaded_step(*engine, ckpt::latest(run));
    CHECK((step == 3 || step == 4));
    const bool committed = point == "committed" || point == "latest-link-made" || point == "latest-swapped" ||
                           point == "retention-one" || point == "dir-renamed";
    CHECK(step == (point == "latest-swapped" || point == "retention-one" ? 4 : 3));
    CHECK(fs::exists(run / dur_step_name(4)) == committed);
    if (committed) CHECK(dur_loaded_step(*engine, run / dur_step_name(4)) == 4);
    CHECK(dur_loaded_step(*engine, run / dur_step_name(3)) == 3);  // never deleted while latest named it
    // The next save (a new job: the dead one's lock is taken over) cleans up
    // what the crash left and goes on.
    dur_save(run, 5, 2, keep);
    CHECK(dur_loaded_step(*engine, ckpt::latest(run)) == 5);
    std::set<std::string> want{"latest", "lock", dur_step_name(5), dur_step_name(committed ? 4 : 3)};
    CHECK(dur_entries(run) == want);
  }
}

TEST_CASE("checkpoint durability - saving a step again while latest names it replaces it in one exchange" *
          doctest::timeout(120)) {
  auto engine = Engine::create({.kind = "threaded", .cpu_devices = 1});
  // A run resumed from an earlier checkpoint saves its steps again; here
  // the very one `latest` names (the hardest case), killed at every point:
  // the name holds a whole checkpoint throughout.
  for (const auto& [point, nth] : kDurPoints) {
    if (point == "retention-one") continue;  // keep 3 of steps 2 and 3: nothing to delete
    INFO("killed at " << point << " #" << nth);
    DurTmpDir tmp("resave");
    const fs::path run = tmp.path / "run";
    dur_save(run, 2, 2, 3);
    dur_save(run, 3, 2, 3);
    const std::string before = dur_read(run / dur_step_name(3) / "index.json");
    dur_save(run, 3, 2, 3, point, nth);
    CHECK(ckpt::latest(run) == run / dur_step_name(3));
    CHECK(dur_loaded_step(*engine, ckpt::latest(run)) == 3);
    CHECK(dur_loaded_step(*engine, run / dur_step_name(2)) == 2);
    // After the exchange the name holds the new save (another identity).
    const bool exchanged = point == "dir-renamed" || point == "committed" || point == "latest-link-made" ||
                           point == "latest-swapped";
    CHECK((dur_read(run / dur_step_name(3) / "index.json") != before) == exchanged);
    dur_save(run, 3, 2, 3);
    CHECK(dur_entries(run) == std::set<std::string>{"latest", "lock", dur_step_name(2), dur_step_name(3)});
  }
}

TEST_CASE("checkpoint durability - retention keeps the newest K and refuses K = 0" * doctest::timeout(60)) {
  auto engine = Engine::create({.kind = "threaded", .cpu_devices = 1});
  DurTmpDir tmp("keep");
  const fs::path run = tmp.path / "run";
  Tensor t = Tensor::ones(*engine, Shape{4});
  for (int step = 1; step <= 5; ++step) ckpt::save(*engine, run / dur_step_name(step), {{"t", t}}, {.run_dir = run, .keep = 2}).wait();
  CHECK(dur_entries(run) == std::set<std::string>{"latest", "lock", dur_step_name(4), dur_step_name(5)});
  CHECK(ckpt::latest(run) == run / dur_step_name(5));
  // `latest` pointed back at an older one (a run resumed from it): keep 1
  // leaves the new save alone.
  ckpt::set_latest(run, run / dur_step_name(4));
  ckpt::save(*engine, run / dur_step_name(6), {{"t", t}}, {.run_dir = run, .keep = 1}).wait();
  CHECK(dur_entries(run) == std::set<std::string>{"latest", "lock", dur_step_name(6)});
  dur_expect_invalid([&] { ckpt::save(*engine, run / dur_step_name(7), {{"t", t}}, {.run_dir = run, .keep = 0}); },
                     {"SaveOptions::keep", "0"});
  engine->wait_all();
  CHECK_FALSE(fs::exists(run / dur_step_name(7)));
}

TEST_CASE("checkpoint durability - a run directory another live job holds is refused, naming it" *
          doctest::timeout(60)) {
  DurTmpDir tmp("lock");
  const fs::path run = tmp.path / "run";
  int out[2];
  REQUIRE(::pipe(out) == 0);
  std::string exe = WEFT_CHECKPOINT_CRASH, mode = "lock", dir = run.string();
  char* argv[] = {exe.data(), mode.data(), dir.data(), nullptr};
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::execv(exe.c_str(), argv);
    ::_exit(127);
  }
  ::close(out[1]);
  char buf[16] = "";
  REQUIRE(::read(out[0], buf, 6) == 6);  // "locked"
  ::close(out[0]);
  auto engine = Engine::create({.kind = "threaded", .cpu_devices = 1});
  Tensor t = Tensor::ones(*engine, Shape{4});
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  dur_expect_invalid([&] { ckpt::lock_run(run); }, {run.string(), "pid " + std::to_string(pid), host, "lock"});
  dur_expect_invalid([&] { ckpt::save(*engine, run / "step-1", {{"t", t}}, {.run_dir = run}); },
                     {"pid " + std::to_string(pid)});
  // Its owner dead (SIGKILL: no clean-up ran), the lock is taken over.
  ::kill(pid, SIGKILL);
  int status = 0;
  ::waitpid(pid, &status, 0);
  ckpt::save(*engine, run / "step-1", {{"t", t}}, {.run_dir = run}).wait();
  CHECK(dur_read(run / "lock").find("pid " + std::to_string(::getpid())) != std::string::npos);
  ckpt::lock_run(run);  // held already: again is fine
}

TEST_CASE("checkpoint durability - ambiguous or mixed-up files are refused, naming the file and key" *
          doctest::timeout(60)) {
  auto engine = Engine::create({.kind = "threaded", .cpu_devices = 1});
  DurTmpDir tmp("mixed");
  Tensor a = Tensor::full(*engine, Shape{4}, 1.0f), b = Tensor::full(*engine, Shape{4}, 2.0f);

  // A header with a key twice: which one holds the data is ambiguous.
  const fs::path dup = tmp.path / "dup.safetensors";
  {
    const std::string header =
        R"({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},)"
        R"( "x": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})";
    std::string s(8, '\0');
    const std::uint64_t n = header.size();
    std::memcpy(s.data(), &n, 8);
    dur_write(dup, s + header + std::string(8, '\x01'));
  }
  dur_expect_invalid([&] { ckpt::SafetensorsFile::open(dup); }, {dup.string(), "'x'", "twice"});
  {
    const std::string header =
        R"({"__metadata__": {"k": "1", "k": "2"}, "x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})";
    std::string s(8, '\0');
    const std::uint64_t n = header.size();
    std::memcpy(s.data(), &n, 8);
    dur_write(dup, s + header + std::string(4, '\x01'));
  }
  dur_expect_invalid([&] { ckpt::Reader::open(dup); }, {dup.string(), "__metadata__", "'k'", "twice"});

  // Two checkpoints of two writers each.
  const fs::path one = tmp.path / "one", two = tmp.path / "two";
  for (const fs::path& dir : {one, two}) {
    const Tensor& t = dir == one ? a : b;
    ckpt::save(*engine, dir, {{"x", t, Shape{8}, 4, 8}}, {.rank = 1, .ranks = 2}).wait();
    ckpt::save(*engine, dir, {{"x", t, Shape{8}, 0, 4}, {"y", t}}, {.rank = 0, .ranks = 2}).wait();
  }
  const std::string shard1 = "rank-00001-of-00002.safetensors";
  const std::string index_text = dur_read(one / "index.json");

  // An index key twice.
  std::string doubled = index_text;
  doubled.insert(doubled.find('{') + 1, "\"ranks\": 2, ");
  dur_write(one / "index.json", doubled);
  dur_expect_invalid([&] { ckpt::Reader::open(one); }, {(one / "index.json").string(), "'ranks'", "twice"});

  // A key in the index that no shard holds.
  nlohmann::json orphan = nlohmann::json::parse(index_text);
  orphan["tensors"]["ghost"] = orphan["tensors"]["y"];
  dur_write(one / "index.json", orphan.dump());
  dur_expect_invalid([&] { ckpt::Reader::open(one); }, {(one / "index.json").string(), "'ghost'", "none of its shards"});
  dur_write(one / "index.json", index_text);

  // A shard another checkpoint claims: two's rank-1 shard copied into one.
  const std::string own_shard = dur_read(one / shard1);
  fs::copy_file(two / shard1, one / shard1, fs::copy_options::overwrite_existing);
  dur_expect_invalid([&] { ckpt::Reader::open(one); },
                     {(one / shard1).string(), "weft.save_id", "another checkpoint", (one / "index.json").string()});
  dur_write(one / shard1, own_shard);
  Tensor x = Tensor::zeros(*engine, Shape{8}), y = Tensor::zeros(*engine, Shape{4});
  ckpt::load(ckpt::Reader::open(one), {{"x", x}, {"y", y}});
  CHECK(x.to_host() == std::vector<float>(8, 1.0f));

  // A load reads the file it validated: a shard replaced after the open
  // (another file renamed over it) is not read at the old offsets.
  const ckpt::Reader reader = ckpt::Reader::open(one);
  fs::copy_file(two / shard1, tmp.path / "other", fs::copy_options::overwrite_existing);
  fs::rename(tmp.path / "other", one / shard1);
  fs::remove(one / "rank-00000-of-00002.safetensors");
  ckpt::load(reader, {{"x", x}, {"y", y}});
  CHECK(x.to_host() == std::vector<float>(8, 1.0f));
  CHECK(y.to_host() == std::vector<float>(4, 1.0f));
  // Opened again, the mix is refused.
  dur_expect_invalid([&] { ckpt::Reader::open(one); }, {one.string(), "rank 0"});
}
