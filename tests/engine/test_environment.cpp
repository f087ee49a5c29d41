// The WEFT_* environment variables: one reader (weft/env.h) and one message
// for a malformed value, whichever layer reads it; unset or empty means the
// default.
#include <doctest/doctest.h>

#include <string>

#include "engine/engine_test_util.h"
#include "weft/engine.h"
#include "weft/env.h"
#include "weft/error.h"

using namespace weft;
using namespace weft_test;

namespace {

// What fn() throws as a weft::InvalidArgument, or "(no error)" (any other
// error escapes and fails the case).
template <class F>
std::string invalid_argument_of(F&& fn) {
  return what_thrown<InvalidArgument>(fn);
}

}  // namespace

TEST_CASE("environment readers: a malformed value names the variable, the value and what it takes" *
          doctest::timeout(60)) {
  const char* name = "WEFT_TEST_ENV_VALUE";
  {
    EnvGuard value(name, "lots");
    CHECK(invalid_argument_of([&] { (void)env::number_or(name, 2, 1, 64); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='lots' is not a number in [1, 64]");
    CHECK(invalid_argument_of([&] { (void)env::real_or(name, 1.5, 0.001, 1e6); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='lots' is not a number in [0.001, 1e+06]");
    CHECK(invalid_argument_of([&] { (void)env::bytes_or(name, 1024); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='lots' is not a size in bytes (a positive number, "
          "optionally with K, M or G; at most 1 PiB)");
    CHECK(invalid_argument_of([&] { (void)env::flag_or(name, true, "checks on", "off"); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='lots' is not 1 (checks on, the default) or 0 (off)");
    CHECK(invalid_argument_of([&] { (void)env::flag_or(name, false, "on", "checks off"); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='lots' is not 1 (on) or 0 (checks off, the default)");
    CHECK(invalid_argument_of([&] { (void)env::choice_or(name, "a", {"a", "b"}); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='lots' is not one of: a, b");
    CHECK(invalid_argument_of([&] { (void)env::number_or(name, 0, 0, 10, "a byte count"); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='lots' is not a byte count");
    // Text is taken as it is.
    CHECK(env::text_or(name, "/default") == "lots");
  }
  // Out of range, trailing junk, a sign where none belongs: malformed alike.
  for (const char* bad : {"65", "0", "8x", " 8", "+8", "-1"}) {
    EnvGuard value(name, bad);
    CHECK(invalid_argument_of([&] { (void)env::number_or(name, 2, 1, 64); }) ==
          "weft: environment variable WEFT_TEST_ENV_VALUE='" + std::string(bad) + "' is not a number in [1, 64]");
  }
  for (const char* bad : {"0", "1T", "4Gb", "-4K"}) {
    EnvGuard value(name, bad);
    CHECK(contains(invalid_argument_of([&] { (void)env::bytes_or(name, 1024); }),
                   "WEFT_TEST_ENV_VALUE='" + std::string(bad) + "' is not a size in bytes"));
  }
  for (const char* bad : {"nan", "inf", "1e400", "0.0001"}) {
    EnvGuard value(name, bad);
    CHECK(contains(invalid_argument_of([&] { (void)env::real_or(name, 1.5, 0.001, 1e6); }),
                   "WEFT_TEST_ENV_VALUE='" + std::string(bad) + "' is not a number in"));
  }
}

TEST_CASE("environment readers: unset or empty means the default, good values are read" * doctest::timeout(60)) {
  const char* name = "WEFT_TEST_ENV_VALUE";
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    EnvGuard value(name, unset);
    CHECK(env::get(name) == nullptr);
    CHECK(env::number_or(name, 7, 1, 64) == 7);
    CHECK(env::real_or(name, 1.5, 0.001, 1e6) == 1.5);
    CHECK(env::bytes_or(name, 1024) == 1024);
    CHECK(env::flag_or(name, true, "on", "off"));
    CHECK(!env::flag_or(name, false, "on", "off"));
    CHECK(env::choice_or(name, "b", {"a", "b"}) == "b");
    CHECK(env::text_or(name, "/default") == "/default");
  }
  {
    EnvGuard value(name, "64");
    CHECK(env::number_or(name, 7, 1, 64) == 64);
    CHECK(env::real_or(name, 1.5, 0.001, 1e6) == 64.0);
    CHECK(env::bytes_or(name, 1024) == 64);
  }
  {
    EnvGuard value(name, "512MiB");
    CHECK(env::bytes_or(name, 1024) == std::size_t{512} << 20);
  }
  {
    EnvGuard value(name, "0");
    CHECK(!env::flag_or(name, true, "on", "off"));
  }
  {
    EnvGuard value(name, "a");
    CHECK(env::choice_or(name, "b", {"a", "b"}) == "a");
  }
}

TEST_CASE("engine settings from the environment: a malformed value has the one message" * doctest::timeout(60)) {
  const EngineConfig threaded{.kind = "threaded", .cpu_devices = 1};
  {
    EnvGuard bad("WEFT_CPU_WORKERS", "lots");
    CHECK(invalid_argument_of([&] { (void)Engine::create(threaded); }) ==
          "weft: environment variable WEFT_CPU_WORKERS='lots' is not a number in [1, 4096]");
  }
  {
    EnvGuard bad("WEFT_CPU_DEVICES", "0");
    CHECK(invalid_argument_of([&] { (void)Engine::create({.kind = "threaded", .workers_per_cpu_device = 1}); }) ==
          "weft: environment variable WEFT_CPU_DEVICES='0' is not a number in [1, 1024]");
  }
  {
    EnvGuard bad("WEFT_MAX_INFLIGHT", "-5");
    CHECK(invalid_argument_of([&] { (void)Engine::create(threaded); }) ==
          "weft: environment variable WEFT_MAX_INFLIGHT='-5' is not a number in [1, 1099511627776]");
  }
  {
    EnvGuard kind("WEFT_ENGINE", "fast");
    CHECK(invalid_argument_of([&] { (void)Engine::create({}); }) ==
          "weft: environment variable WEFT_ENGINE='fast' is not one of: threaded, naive");
  }
  {
    EnvGuard backend("WEFT_GPU_BACKEND", "gpu");
    CHECK(invalid_argument_of([&] { (void)Engine::create(threaded); }) ==
          "weft: environment variable WEFT_GPU_BACKEND='gpu' is not one of: cuda, sim, none");
  }
  {
    EnvGuard streams("WEFT_GPU_STREAMS", "many");
    CHECK(invalid_argument_of([&] { (void)Engine::create(threaded); }) ==
          "weft: environment variable WEFT_GPU_STREAMS='many' is not a number in [1, 64]");
  }
  {
    EnvGuard algo("WEFT_CONV_ALGO", "fastest");
    CHECK(invalid_argument_of([&] { (void)Engine::create(threaded); }) ==
          "weft: environment variable WEFT_CONV_ALGO='fastest' is not one of: heuristic, benchmark, deterministic, "
          "benchmark+deterministic");
  }
  // Empty is unset: the default.
  {
    EnvGuard empty("WEFT_CPU_WORKERS", "");
    CHECK(Engine::create({.kind = "threaded", .cpu_devices = 1})->kind() == "threaded");
  }
}

TEST_CASE("engine settings from the environment: the convolution algorithm choice" * doctest::timeout(60)) {
  {
    EnvGuard algo("WEFT_CONV_ALGO", "benchmark+deterministic");
    auto e = Engine::create({.kind = "threaded", .cpu_devices = 1});
    CHECK(e->conv_algo() == weft::ConvAlgo{true, true});
    CHECK(e->conv_algo().str() == "benchmark+deterministic");
    e->set_conv_algo(weft::ConvAlgo{});
    CHECK(e->conv_algo().str() == "heuristic");
    // The field wins over the variable.
    CHECK(Engine::create({.kind = "naive", .conv_algo = "deterministic"})->conv_algo() == weft::ConvAlgo{false, true});
  }
  CHECK(Engine::create({.kind = "naive"})->conv_algo().str() == "heuristic");
  CHECK(invalid_argument_of([&] { (void)Engine::create({.kind = "naive", .conv_algo = "fast"}); }) ==
        "weft::EngineConfig::conv_algo = 'fast' is not one of: heuristic, benchmark, deterministic, "
        "benchmark+deterministic");
}
