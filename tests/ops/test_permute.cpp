// ops::permute on CPU devices against a reference gathered here by explicit
// index arithmetic (never by calling permute): every permutation of ranks 1
// to 4 and several of ranks 5 and 6 in float32, bfloat16, float16, float64
// and int32 (the last two written and read as raw memory: the op moves
// bytes), the GPT attention layer's two permutations, an inverse round
// trip, a view at an offset, empty and large tensors, and every push-time
// error. Each case runs on the naive engine and on the threaded one at every
// worker count of test_workers.h.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "storage.h"
#include "tensor_test_util.h"
#include "test_workers.h"
#include "weft/engine.h"
#include "weft/ops.h"

namespace {

using weft::Device;
using weft::DType;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
using weft_optest::error_of;
using weft_optest::for_each_engine_and_workers;
using weft_optest::has;
using weft_optest::i64;
using weft_optest::Rng;
namespace ops = weft::ops;

std::string dims_text(const std::vector<int>& dims) {
  std::string s = "{";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(dims[i]);
  }
  return s + "}";
}

// The reference: out element i (an index over out's shape) is x's element j
// with j[dims[a]] = i[a]; elements of `elem` bytes, x contiguous.
std::vector<unsigned char> gather(const std::vector<unsigned char>& x, const std::vector<i64>& shape,
                                  const std::vector<int>& dims, std::size_t elem) {
  const std::size_t rank = shape.size();
  std::vector<i64> out_shape(rank), x_stride(rank, 1);
  for (std::size_t a = 0; a < rank; ++a) out_shape[a] = shape[static_cast<std::size_t>(dims[a])];
  for (std::size_t a = rank - 1; a-- > 0;) x_stride[a] = x_stride[a + 1] * shape[a + 1];
  i64 numel = 1;
  for (i64 e : shape) numel *= e;
  std::vector<unsigned char> out(static_cast<std::size_t>(numel) * elem);
  std::vector<i64> i(rank), j(rank);
  for (i64 flat = 0; flat < numel; ++flat) {
    i64 r = flat;
    for (std::size_t a = rank; a-- > 0;) {
      i[a] = r % out_shape[a];
      r /= out_shape[a];
    }
    for (std::size_t a = 0; a < rank; ++a) j[static_cast<std::size_t>(dims[a])] = i[a];
    i64 src = 0;
    for (std::size_t a = 0; a < rank; ++a) src += j[a] * x_stride[a];
    std::memcpy(out.data() + static_cast<std::size_t>(flat) * elem, x.data() + static_cast<std::size_t>(src) * elem,
                elem);
  }
  return out;
}

template <class T>
std::vector<unsigned char> as_bytes(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// A tensor of a dtype from_host does not take (float64, int32) holding
// `bytes`: its storage written on the host before any op is pushed.
Tensor raw_tensor(Engine& e, const Shape& shape, DType t, const std::vector<unsigned char>& bytes, Device device) {
  auto storage = std::make_shared<weft::detail::Storage>(e, device, t, bytes.size(), "");
  storage->materialize(nullptr);
  if (!bytes.empty()) std::memcpy(storage->data(), bytes.data(), bytes.size());
  storage->creator_pending = false;
  return Tensor::wrap(std::move(storage), shape);
}

std::vector<unsigned char> raw_bytes(const Tensor& t) {
  t.wait_to_read();
  std::vector<unsigned char> b(t.nbytes());
  if (!b.empty())
    std::memcpy(b.data(),
                static_cast<const unsigned char*>(t.storage()->data()) +
                    static_cast<std::size_t>(t.storage_offset()) * weft::dtype_size(t.dtype()),
                b.size());
  return b;
}

// x (random values of dtype t, shape `shape`) permuted by `dims` on cpu(1)
// and compared bit for bit with the gathered reference; the output's shape
// and dtype checked too.
void check_permute(Engine& e, const std::vector<i64>& shape, const std::vector<int>& dims, DType t, Rng& rng) {
  INFO("shape " << Shape(shape).str() << " dims " << dims_text(dims) << " " << weft::to_string(t));
  i64 numel = 1;
  for (i64 s : shape) numel *= s;
  const Device dev = Device::cpu(1);
  std::vector<unsigned char> xb;
  Tensor x;
  if (weft::has_kernels(t)) {
    x = Tensor::from_host(e, Shape(shape), rng.vec(numel, -4.0f, 4.0f), dev, t);
    xb = as_bytes(x.to_host());  // the values in t, widened exactly: compared as float32
  } else if (t == DType::float64) {
    std::vector<double> v(static_cast<std::size_t>(numel));
    for (double& d : v) d = static_cast<double>(rng.uniform(-4.0f, 4.0f)) + 1e-12 * rng.uniform(0.0f, 1.0f);
    xb = as_bytes(v);
    x = raw_tensor(e, Shape(shape), t, xb, dev);
  } else {
    std::vector<std::int32_t> v(static_cast<std::size_t>(numel));
    for (std::int32_t& d : v) d = static_cast<std::int32_t>(rng.integer(-2000000000, 2000000000));
    xb = as_bytes(v);
    x = raw_tensor(e, Shape(shape), t, xb, dev);
  }
  const Tensor y = ops::permute(x, dims);
  std::vector<i64> want_shape;
  for (int d : dims) want_shape.push_back(shape[static_cast<std::size_t>(d)]);
  CHECK(y.shape() == Shape(want_shape));
  CHECK(y.dtype() == t);
  CHECK(y.device() == dev);
  CHECK(y.memory_format() == weft::MemoryFormat::contiguous);
  CHECK(y.storage() != x.storage());  // a new tensor, the identity too
  const bool widened = weft::has_kernels(t);
  const std::vector<unsigned char> want = gather(xb, shape, dims, widened ? sizeof(float) : weft::dtype_size(t));
  const std::vector<unsigned char> got = widened ? as_bytes(y.to_host()) : raw_bytes(y);
  CHECK(got.size() == want.size());
  CHECK(got == want);
}

const DType kAllTypes[] = {DType::float32, DType::bfloat16, DType::float16, DType::float64, DType::int32};

std::vector<int> inverse(const std::vector<int>& dims) {
  std::vector<int> inv(dims.size());
  for (std::size_t a = 0; a < dims.size(); ++a) inv[static_cast<std::size_t>(dims[a])] = static_cast<int>(a);
  return inv;
}

}  // namespace

TEST_CASE("permute - every permutation of ranks 1 to 4 in every dtype against index arithmetic" *
          doctest::timeout(240)) {
  const std::vector<std::vector<i64>> shapes{{5}, {3, 4}, {2, 3, 5}, {2, 3, 4, 5}};
  for_each_engine_and_workers([&](Engine& e) {
    Rng rng(101);
    for (const auto& shape : shapes) {
      std::vector<int> dims(shape.size());
      std::iota(dims.begin(), dims.end(), 0);
      do {
        for (DType t : kAllTypes) check_permute(e, shape, dims, t, rng);
      } while (std::next_permutation(dims.begin(), dims.end()));
    }
  });
}

TEST_CASE("permute - ranks 5 and 6, extents of 1, empty and large tensors" * doctest::timeout(240)) {
  for_each_engine_and_workers([&](Engine& e) {
    Rng rng(102);
    for (DType t : kAllTypes) {
      check_permute(e, {2, 3, 4, 2, 3}, {4, 3, 2, 1, 0}, t, rng);
      check_permute(e, {2, 3, 4, 2, 3}, {1, 4, 0, 2, 3}, t, rng);
      check_permute(e, {2, 3, 2, 3, 2, 2}, {5, 4, 3, 2, 1, 0}, t, rng);
      check_permute(e, {2, 3, 2, 3, 2, 2}, {3, 0, 5, 1, 4, 2}, t, rng);
      check_permute(e, {2, 3, 2, 3, 2, 2}, {0, 1, 2, 3, 5, 4}, t, rng);
      check_permute(e, {2, 3, 2, 3, 2, 2}, {0, 1, 2, 3, 4, 5}, t, rng);  // identity: a copy
      // Random permutations of rank 6.
      for (int k = 0; k < 4; ++k) {
        std::vector<int> dims{0, 1, 2, 3, 4, 5};
        std::shuffle(dims.begin(), dims.end(), rng.gen);
        check_permute(e, {3, 2, 1, 4, 2, 3}, dims, t, rng);
      }
      // Axes of extent 1 (dropped by the kernels' geometry) among others.
      check_permute(e, {1, 4, 1, 3}, {3, 2, 0, 1}, t, rng);
      check_permute(e, {1, 1, 1}, {2, 0, 1}, t, rng);
      // Empty tensors: the shape is permuted, nothing runs.
      check_permute(e, {0, 3}, {1, 0}, t, rng);
      check_permute(e, {2, 0, 4}, {2, 1, 0}, t, rng);
    }
    // Large enough that the CPU kernel splits its rows across threads, with
    // the last axis staying last (memcpy runs) and moving (strided reads).
    check_permute(e, {64, 48, 33}, {1, 0, 2}, DType::float32, rng);
    check_permute(e, {64, 48, 33}, {2, 0, 1}, DType::float32, rng);
    check_permute(e, {40, 3, 17, 29}, {3, 1, 0, 2}, DType::float64, rng);
  });
}

TEST_CASE("permute - the GPT attention layer's permutations and an inverse round trip" * doctest::timeout(120)) {
  for_each_engine_and_workers([&](Engine& e) {
    Rng rng(103);
    for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
      check_permute(e, {2, 5, 3, 4, 8}, {2, 0, 3, 1, 4}, t, rng);  // [B, T, 3, H, D] -> [3, B, H, T, D]
      check_permute(e, {2, 4, 5, 8}, {0, 2, 1, 3}, t, rng);        // [B, H, T, D] -> [B, T, H, D]
      check_permute(e, {2, 5, 4, 8}, {0, 2, 1, 3}, t, rng);        // and back
    }
    // permute by dims, then by their inverse: x again, bit for bit.
    for (const std::vector<int>& dims : {std::vector<int>{2, 0, 3, 1, 4}, std::vector<int>{4, 2, 0, 1, 3},
                                         std::vector<int>{5, 0, 4, 1, 3, 2}}) {
      INFO("dims " << dims_text(dims));
      const std::vector<i64> shape = dims.size() == 5 ? std::vector<i64>{2, 5, 3, 4, 8} : std::vector<i64>{2, 3, 4, 2, 3, 5};
      i64 n = 1;
      for (i64 s : shape) n *= s;
      const std::vector<float> v = rng.vec(n);
      const Tensor x = Tensor::from_host(e, Shape(shape), v);
      const Tensor y = ops::permute(x, dims);
      const Tensor back = ops::permute(y, inverse(dims));
      CHECK(back.shape() == x.shape());
      CHECK(weft_optest::bitwise_equal(back.to_host(), v));
      CHECK_FALSE(weft_optest::bitwise_equal(y.to_host(), v));  // the middle step did move elements
    }
  });
}

TEST_CASE("permute - a view at an offset reads its own elements only" * doctest::timeout(60)) {
  for_each_engine_and_workers([&](Engine& e) {
    Rng rng(104);
    const std::vector<float> flat = rng.vec(200);
    const Tensor whole = Tensor::from_host(e, Shape{200}, flat, Device::cpu(0));
    const Tensor x = whole.view(17, Shape{3, 4, 5});
    CHECK(x.storage_offset() == 17);
    const std::vector<float> xv(flat.begin() + 17, flat.begin() + 17 + 60);
    for (const std::vector<int>& dims : {std::vector<int>{2, 0, 1}, std::vector<int>{1, 0, 2}, std::vector<int>{0, 1, 2}}) {
      INFO("dims " << dims_text(dims));
      const Tensor y = ops::permute(x, dims);
      const std::vector<unsigned char> want = gather(as_bytes(xv), {3, 4, 5}, dims, sizeof(float));
      CHECK(as_bytes(y.to_host()) == want);
    }
    // A float64 view too: the offset is counted in its own elements.
    std::vector<double> d(90);
    for (double& v : d) v = static_cast<double>(rng.uniform(-1.0f, 1.0f)) / 3.0;
    const Tensor whole64 = raw_tensor(e, Shape{90}, DType::float64, as_bytes(d), Device::cpu(1));
    const Tensor x64 = whole64.view(30, Shape{2, 6, 5});
    const std::vector<double> part(d.begin() + 30, d.end());
    CHECK(raw_bytes(ops::permute(x64, {2, 1, 0})) == gather(as_bytes(part), {2, 6, 5}, {2, 1, 0}, sizeof(double)));
  });
}

TEST_CASE("permute - bad dims, ranks and layouts are InvalidArgument naming the op, tensor, shape and dims" *
          doctest::timeout(60)) {
  for_each_engine_and_workers([&](Engine& e) {
    Tensor x = Tensor::zeros(e, Shape{2, 3, 4});
    x.set_name("qkv");
    const auto invalid = [](auto&& f, std::vector<std::string> parts) {
      bool is_invalid = false;
      try {
        f();
      } catch (const weft::InvalidArgument&) {
        is_invalid = true;
      } catch (...) {
      }
      CHECK(is_invalid);
      const std::string msg = error_of(f);
      INFO(msg);
      CHECK(has(msg, "permute"));
      for (const std::string& p : parts) CHECK(has(msg, p));
    };
    invalid([&] { ops::permute(x, {1, 0}); }, {"'qkv'", "[2, 3, 4]", "[1, 0]", "rank-3"});
    invalid([&] { ops::permute(x, {2, 1, 0, 3}); }, {"'qkv'", "[2, 3, 4]", "[2, 1, 0, 3]"});
    invalid([&] { ops::permute(x, {}); }, {"'qkv'", "[2, 3, 4]", "[]"});
    invalid([&] { ops::permute(x, {0, 0, 1}); }, {"'qkv'", "[2, 3, 4]", "[0, 0, 1]", "axis 0 appears twice"});
    invalid([&] { ops::permute(x, {0, 3, 1}); }, {"'qkv'", "[0, 3, 1]", "axis 3 is outside [0, 3)"});
    invalid([&] { ops::permute(x, {0, -1, 1}); }, {"'qkv'", "[0, -1, 1]", "axis -1 is outside"});
    const Tensor scalar = Tensor::zeros(e, Shape{});
    invalid([&] { ops::permute(scalar, {}); }, {"[]", "rank 0 is outside 1..6"});
    const Tensor seven = Tensor::zeros(e, Shape{1, 2, 1, 2, 1, 2, 1});
    invalid([&] { ops::permute(seven, {0, 1, 2, 3, 4, 5, 6}); }, {"[1, 2, 1, 2, 1, 2, 1]", "rank 7 is outside 1..6"});
    const Tensor nhwc = ops::to_memory_format(Tensor::zeros(e, Shape{2, 3, 4, 5}), weft::MemoryFormat::channels_last);
    invalid([&] { ops::permute(nhwc, {0, 2, 3, 1}); }, {"[2, 3, 4, 5] channels_last", "[0, 2, 3, 1]", "contiguous"});
    invalid([&] { ops::permute(Tensor(), {0}); }, {"undefined"});
    // Nothing was pushed by the failed calls: x still reads as zeros.
    for (float v : x.to_host()) CHECK(v == 0.0f);
  });
}
