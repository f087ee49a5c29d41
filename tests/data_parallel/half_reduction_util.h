// Shared by the tests of DataParallel's half-precision bucket reduction on
// CPU devices and on GPUs (test_data_parallel_half*.cpp): the reduction of
// one bucket against its exact value, a few training steps against the
// float32 reduction, and error feedback against none.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "collectives/half_values.h"
#include "data_parallel/data_parallel_util.h"
#include "weft/dtype.h"
#include "weft/error.h"

namespace dp_half_test {

using namespace dp_test;
using weft::DType;

// Replica r's flat tensor of `bucket` becomes values[r].
inline void fill(Engine& e, const par::GradientBucket& bucket, const std::vector<std::vector<float>>& values) {
  for (std::size_t r = 0; r < bucket.flat.size(); ++r) {
    Tensor flat = bucket.flat[r];  // a handle: the same storage
    flat.copy_from(Tensor::from_host(e, flat.shape(), values[r], flat.device()));
  }
}

inline std::vector<float> pseudo_random(std::int64_t n, std::uint64_t seed) {
  std::vector<float> v(static_cast<std::size_t>(n));
  std::uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
  for (float& x : v) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    x = static_cast<float>(s % 2000001) / 1000000.0f - 1.0f;
  }
  return v;
}

// A trainer of the MLP over `devices` with all its gradients in one bucket.
inline std::unique_ptr<par::DataParallel> one_bucket_mlp(Engine& e, const std::vector<Device>& devices) {
  const ModelFn make = mlp_model();
  return std::make_unique<par::DataParallel>(
      e, devices, [&](Device d) { return make(e, d, static_cast<std::uint64_t>(d.index())); },
      par::DataParallelOptions{.bucket_bytes = std::size_t{25} << 20});
}

// One bucket reduced by half_precision_reduction: each replica's part
// rounded to the dtype, the parts summed in float32 and the sum rounded
// once — exactly, for parts exact in the dtype and for arbitrary ones.
inline void check_bucket(Engine& e, const std::vector<Device>& devices) {
  auto dp = one_bucket_mlp(e, devices);
  REQUIRE(dp->buckets().size() == 1);
  const par::GradientBucket& bucket = dp->buckets()[0];
  const int n = static_cast<int>(devices.size());
  const std::int64_t count = bucket.elements;
  for (DType dtype : {DType::bfloat16, DType::float16}) {
    INFO(half_test::name(dtype));
    const par::BucketReduction reduce = par::half_precision_reduction(*dp, {.dtype = dtype});
    std::vector<std::vector<float>> exact, arbitrary;
    for (int r = 0; r < n; ++r) {
      exact.push_back(half_test::values(r, count));
      arbitrary.push_back(pseudo_random(count, static_cast<std::uint64_t>(r + 1)));
    }
    fill(e, bucket, exact);
    reduce(bucket);
    for (int r = 0; r < n; ++r) {
      const std::vector<float> got = bucket.flat[static_cast<std::size_t>(r)].to_host();
      for (std::int64_t i = 0; i < count; ++i) {
        INFO("replica " << r << ", element " << i);
        REQUIRE(got[static_cast<std::size_t>(i)] == half_test::rounded_once(dtype, n, i, par::ReduceOp::sum));
      }
    }
    fill(e, bucket, arbitrary);
    reduce(bucket);
    const double u = half_test::unit_roundoff(dtype);
    for (int r = 0; r < n; ++r) {
      const std::vector<float> got = bucket.flat[static_cast<std::size_t>(r)].to_host();
      for (std::int64_t i = 0; i < count; ++i) {
        const auto k = static_cast<std::size_t>(i);
        float sum = 0;
        double exact_sum = 0, magnitude = 0;
        for (int m = 0; m < n; ++m) {
          const float part = arbitrary[static_cast<std::size_t>(m)][k];
          sum += half_test::round_to(dtype, part);
          exact_sum += part;
          magnitude += std::fabs(part);
        }
        INFO("replica " << r << ", element " << i);
        REQUIRE(got[k] == half_test::round_to(dtype, sum));
        // Two roundings of the dtype: each part's, then the sum's (plus
        // float16's subnormal spacing, 2^-24, for parts near zero).
        REQUIRE(std::fabs(got[k] - exact_sum) <= 2 * u * magnitude + std::ldexp(1.0, -23));
      }
    }
  }
}

// A few training steps with the bfloat16 reduction (with and without
// error feedback) against the same steps with the float32 one: every
// parameter within 5% of how far the float32 run moved that tensor (bf16's
// rounding is 0.4% per cast), and not identical (the reduction ran).
inline void check_training(Engine& e, const std::vector<Device>& devices) {
  const std::vector<Batch> batches = mlp_batches(3, 10);
  const float lr = 0.1f;
  const auto start = values_of(*mlp_model()(e, devices[0], 0));
  auto plain = data_parallel_run(e, mlp_model(), devices, batches, lr);
  const auto want = values_of(plain->replica(0));
  for (bool feedback : {false, true}) {
    INFO((feedback ? "error feedback" : "no error feedback"));
    auto half = data_parallel_run(e, mlp_model(), devices, batches, lr, {}, 1, [&](par::DataParallel& dp) {
      dp.set_reduction(par::half_precision_reduction(dp, {.dtype = DType::bfloat16, .error_feedback = feedback}));
    });
    double differs = 0;
    for (int r = 0; r < half->replicas(); ++r) {
      const auto got = values_of(half->replica(r));
      REQUIRE(got.size() == want.size());
      for (std::size_t t = 0; t < want.size(); ++t) {
        double moved = 0, diff = 0;
        for (std::size_t j = 0; j < want[t].size(); ++j) {
          moved = std::max(moved, std::fabs(static_cast<double>(want[t][j]) - start[t][j]));
          diff = std::max(diff, std::fabs(static_cast<double>(got[t][j]) - want[t][j]));
        }
        INFO("replica " << r << ", parameter " << t << ": moved " << moved << ", differs by " << diff);
        CHECK(diff <= 0.05 * moved);
        differs += diff;
      }
    }
    CHECK(differs > 0);
  }
}

// The same parts reduced k times: with error feedback the running sum of
// the results stays closer to k times the exact sum than without, where
// each step repeats the same rounding.
inline void check_error_feedback(Engine& e, const std::vector<Device>& devices) {
  auto dp = one_bucket_mlp(e, devices);
  const par::GradientBucket& bucket = dp->buckets()[0];
  const int n = static_cast<int>(devices.size()), steps = 16;
  const std::int64_t count = bucket.elements;
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < n; ++r) parts.push_back(pseudo_random(count, static_cast<std::uint64_t>(r + 11)));
  std::vector<double> exact(static_cast<std::size_t>(count), 0.0);
  for (const auto& p : parts)
    for (std::size_t i = 0; i < p.size(); ++i) exact[i] += static_cast<double>(p[i]) * steps;
  double error[2] = {0, 0};
  for (bool feedback : {false, true}) {
    const par::BucketReduction reduce =
        par::half_precision_reduction(*dp, {.dtype = DType::bfloat16, .error_feedback = feedback});
    std::vector<double> sum(static_cast<std::size_t>(count), 0.0);
    for (int s = 0; s < steps; ++s) {
      fill(e, bucket, parts);
      reduce(bucket);
      const std::vector<float> got = bucket.flat[0].to_host();
      for (std::size_t i = 0; i < got.size(); ++i) sum[i] += got[i];
    }
    for (std::size_t i = 0; i < sum.size(); ++i) error[feedback ? 1 : 0] += std::fabs(sum[i] - exact[i]);
  }
  MESSAGE("accumulated error over " << steps << " steps: " << error[0] << " without error feedback, " << error[1]
                                    << " with");
  CHECK(error[1] < 0.5 * error[0]);
}

inline void check_refusals(Engine& e, const std::vector<Device>& devices) {
  auto dp = one_bucket_mlp(e, devices);
  CHECK_THROWS_WITH_AS(par::half_precision_reduction(*dp, {.dtype = DType::float32}),
                       doctest::Contains("dtype float32 is not a half-precision type"), weft::InvalidArgument);
}

}  // namespace dp_half_test
