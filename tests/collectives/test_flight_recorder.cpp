// The flight recorder in one process: the ring keeps the last N calls with
// their states, a dump writes them with the engine's pending ops (a
// collective waiting on a tensor a stalled op holds), and bad settings are
// refused by name. Across processes: tests/collectives/check-flight.sh.
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "weft/engine.h"
#include "weft/error.h"
#include "weft/parallel/collectives.h"
#include "weft/parallel/flight_recorder.h"
#include "weft/tensor.h"

namespace par = weft::parallel;

namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::size_t count_of(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A fresh directory for the dumps (WEFT_FLIGHT_RECORDER_DIR), and the
// capacity restored at the end.
struct DumpDir {
  std::string path;
  std::size_t capacity = par::flight_recorder_capacity();
  DumpDir() {
    char name[] = "/tmp/weft-flight-test-XXXXXX";
    path = ::mkdtemp(name);
    ::setenv("WEFT_FLIGHT_RECORDER_DIR", path.c_str(), 1);
  }
  ~DumpDir() {
    par::set_flight_recorder_capacity(capacity);
    ::unsetenv("WEFT_FLIGHT_RECORDER_DIR");
    std::remove(par::flight_record_path().c_str());
    std::remove((path + "/weft-flight-pid" + std::to_string(::getpid()) + ".json").c_str());
    ::rmdir(path.c_str());
  }
};

}  // namespace

TEST_CASE("the flight recorder keeps the last N calls with their states and dumps them") {
  DumpDir dir;
  par::set_flight_recorder_capacity(4);
  auto engine = weft::Engine::create({.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = 1});
  const par::Communicator comm = par::Communicator::local(*engine, {weft::Device::cpu(0), weft::Device::cpu(1)});
  std::vector<weft::Tensor> t = {weft::Tensor::ones(*engine, weft::Shape{1000}, weft::Device::cpu(0)),
                                 weft::Tensor::ones(*engine, weft::Shape{1000}, weft::Device::cpu(1))};
  for (int i = 0; i < 5; ++i) par::allreduce(comm, t, par::ReduceOp::sum, {.name = "step" + std::to_string(i)});
  par::broadcast(comm, t, {.name = "weights", .root = 1});
  engine->wait_all();

  const std::string path = par::dump_flight_record("unit test");
  CHECK(path == par::flight_record_path());
  const std::string text = read_all(path);
  REQUIRE_FALSE(text.empty());
  CHECK(text.find("\"format\": \"weft-flight-record\"") != std::string::npos);
  CHECK(text.find("\"reason\": \"unit test\"") != std::string::npos);
  CHECK(text.find("\"pid\": " + std::to_string(::getpid())) != std::string::npos);
  // 6 calls, 4 kept: the last ones.
  CHECK(text.find("\"recorded\": 6") != std::string::npos);
  CHECK(count_of(text, "\"record\": ") == 4);
  CHECK(text.find("\"name\": \"step1\"") == std::string::npos);
  CHECK(text.find("\"name\": \"step2\"") != std::string::npos);
  CHECK(text.find("\"seq\": 6, \"kind\": \"broadcast\", \"name\": \"weights\", \"dtype\": \"float32\", \"count\": 1000, "
                  "\"peer\": -1, \"root\": 1, \"state\": \"completed\"") != std::string::npos);
  CHECK(count_of(text, "\"state\": \"completed\"") == 4);
  CHECK(count_of(text, "\"started_us\"") == 4);
  CHECK(count_of(text, "\"ended_us\"") == 4);
  CHECK(text.find("in-process communicator of 2 members") != std::string::npos);
}

TEST_CASE("a dump shows a collective queued behind a stalled op and the op holding its tensor") {
  DumpDir dir;
  par::set_flight_recorder_capacity(16);
  auto engine = weft::Engine::create({.kind = "threaded", .cpu_devices = 2, .workers_per_cpu_device = 1});
  const par::Communicator comm = par::Communicator::local(*engine, {weft::Device::cpu(0), weft::Device::cpu(1)});
  std::vector<weft::Tensor> t = {weft::Tensor::ones(*engine, weft::Shape{64}, weft::Device::cpu(0)).set_name("grad0"),
                                 weft::Tensor::ones(*engine, weft::Shape{64}, weft::Device::cpu(1)).set_name("grad1")};
  engine->wait_all();
  std::atomic<bool> running{false}, release{false};
  engine->push(
      [&] {
        running = true;
        while (!release.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      },
      weft::Device::cpu(1), {}, {t[1].var()}, {.name = "slow backward"});
  while (!running.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  par::allreduce(comm, t, par::ReduceOp::sum, {.name = "grads"});
  const std::string text = read_all(par::dump_flight_record("stalled"));
  release = true;
  engine->wait_all();
  CHECK(text.find("\"kind\": \"allreduce\", \"name\": \"grads\", \"dtype\": \"float32\", \"count\": 64, \"peer\": -1, "
                  "\"root\": -1, \"state\": \"queued\"") != std::string::npos);
  CHECK(text.find("\"name\": \"slow backward\", \"device\": \"cpu(1)\", \"state\": \"running\"") != std::string::npos);
  CHECK(text.find("\"name\": \"allreduce 'grads' #1\", \"device\": \"cpu(0)\", \"state\": \"waiting\"") !=
        std::string::npos);
  CHECK(text.find("\"var_name\": \"grad1\", \"access\": \"write\", \"holder\": ") != std::string::npos);
  CHECK(text.find("\"holder_name\": \"slow backward\", \"holder_state\": \"running\"") != std::string::npos);
  // Once done, the entry says so.
  const std::string after = read_all(par::dump_flight_record("after"));
  CHECK(after.find("\"name\": \"grads\", \"dtype\": \"float32\", \"count\": 64, \"peer\": -1, \"root\": -1, "
                   "\"state\": \"completed\"") != std::string::npos);
  CHECK(after.find("\"pending_ops\": [\n]") != std::string::npos);
}

TEST_CASE("the flight recorder off records nothing and a bad capacity is refused") {
  DumpDir dir;
  par::set_flight_recorder_capacity(0);
  CHECK(par::dump_flight_record("off") == "");
  CHECK_THROWS_WITH_AS(par::set_flight_recorder_capacity(2000000), doctest::Contains("1000000"),
                       weft::InvalidArgument);
  // A directory that does not exist: the error names the file.
  par::set_flight_recorder_capacity(2);
  ::setenv("WEFT_FLIGHT_RECORDER_DIR", "/nonexistent/weft-flight-dir", 1);
  CHECK_THROWS_WITH_AS(par::dump_flight_record("x"), doctest::Contains("/nonexistent/weft-flight-dir/weft-flight-"),
                       weft::Error);
}

TEST_CASE("SIGUSR1 dumps the flight record from the recorder's thread") {
  DumpDir dir;
  par::set_flight_recorder_capacity(4);
  struct sigaction current {};
  REQUIRE(::sigaction(SIGUSR1, nullptr, &current) == 0);
  // Free when the recorder started (doctest leaves SIGUSR1 alone): its handler.
  const bool handled = current.sa_handler != SIG_DFL && current.sa_handler != SIG_IGN;
  REQUIRE(handled);
  const std::string path = par::flight_record_path();
  std::remove(path.c_str());
  REQUIRE(::raise(SIGUSR1) == 0);
  std::string text;
  for (int i = 0; i < 200 && text.find("\n}\n") == std::string::npos; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
    text = read_all(path);
  }
  CHECK(text.find("\"reason\": \"SIGUSR1\"") != std::string::npos);
}
