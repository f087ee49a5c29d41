// ops::permute on gpu(0) (the CUDA gather kernel on a real GPU, the CPU
// kernel as stream work on a simulated one) against a reference gathered on
// the host by explicit index arithmetic: the GPT attention layer's two
// permutations, ranks 1 to 6, an identity, a view at an offset and an
// inverse round trip, in float32, bfloat16 and float16 (elements of 4 and 2
// bytes), bit for bit.
#include <cstring>
#include <numeric>

#include "gpu_test_util.h"
#include "weft/ops.h"

using namespace gputest;
namespace ops = weft::ops;

namespace {

using weft::DType;

// out element i (an index over out's shape) is x's element j with j[dims[a]] = i[a].
std::vector<float> pm_gather(const std::vector<float>& x, const std::vector<std::int64_t>& shape,
                             const std::vector<int>& dims) {
  const std::size_t rank = shape.size();
  std::vector<std::int64_t> out_shape(rank), x_stride(rank, 1), i(rank), j(rank);
  for (std::size_t a = 0; a < rank; ++a) out_shape[a] = shape[static_cast<std::size_t>(dims[a])];
  for (std::size_t a = rank - 1; a-- > 0;) x_stride[a] = x_stride[a + 1] * shape[a + 1];
  std::vector<float> out(x.size());
  for (std::size_t flat = 0; flat < x.size(); ++flat) {
    std::int64_t r = static_cast<std::int64_t>(flat);
    for (std::size_t a = rank; a-- > 0;) {
      i[a] = r % out_shape[a];
      r /= out_shape[a];
    }
    for (std::size_t a = 0; a < rank; ++a) j[static_cast<std::size_t>(dims[a])] = i[a];
    std::int64_t src = 0;
    for (std::size_t a = 0; a < rank; ++a) src += j[a] * x_stride[a];
    out[flat] = x[static_cast<std::size_t>(src)];
  }
  return out;
}

std::string pm_dims(const std::vector<int>& dims) {
  std::string s = "{";
  for (std::size_t k = 0; k < dims.size(); ++k) {
    if (k) s += ",";
    s += std::to_string(dims[k]);
  }
  return s + "}";
}

void pm_check(Engine& e, const std::vector<std::int64_t>& shape, const std::vector<int>& dims, DType t,
              std::uint64_t key) {
  INFO("shape " << Shape(shape).str() << " dims " << pm_dims(dims) << " " << weft::to_string(t));
  std::int64_t n = 1;
  for (std::int64_t s : shape) n *= s;
  const Tensor x = Tensor::from_host(e, Shape(shape), random_values(static_cast<std::size_t>(n), key, -4.0f, 4.0f),
                                     Device::gpu(0), t);
  const std::vector<float> xv = x.to_host();  // the values in t, widened exactly
  const Tensor y = ops::permute(x, dims);
  CHECK(y.device() == Device::gpu(0));
  CHECK(y.dtype() == t);
  std::vector<std::int64_t> want_shape;
  for (int d : dims) want_shape.push_back(shape[static_cast<std::size_t>(d)]);
  CHECK(y.shape() == Shape(want_shape));
  expect_bits_equal(y.to_host(), pm_gather(xv, shape, dims), "permute " + pm_dims(dims));
}

}  // namespace

TEST_CASE("gpu permute - ranks 1 to 6, the GPT permutations and a view at an offset, bit for bit" *
          doctest::timeout(120)) {
  WEFT_REQUIRE_GPU();
  auto e = make_engine({.kind = "threaded", .gpu_devices = 1});
  std::uint64_t key = 300;
  for (DType t : {DType::float32, DType::bfloat16, DType::float16}) {
    pm_check(*e, {2, 5, 3, 4, 8}, {2, 0, 3, 1, 4}, t, ++key);  // [B, T, 3, H, D] -> [3, B, H, T, D]
    pm_check(*e, {2, 4, 5, 8}, {0, 2, 1, 3}, t, ++key);        // [B, H, T, D] -> [B, T, H, D]
    pm_check(*e, {7}, {0}, t, ++key);
    pm_check(*e, {33, 70}, {1, 0}, t, ++key);
    pm_check(*e, {3, 11, 70}, {2, 0, 1}, t, ++key);
    pm_check(*e, {2, 3, 4, 5}, {3, 1, 0, 2}, t, ++key);
    pm_check(*e, {2, 3, 2, 3, 2, 2}, {5, 4, 3, 2, 1, 0}, t, ++key);
    pm_check(*e, {2, 3, 2, 3, 2, 2}, {3, 0, 5, 1, 4, 2}, t, ++key);
    pm_check(*e, {2, 3, 1, 3, 2, 2}, {0, 1, 2, 3, 4, 5}, t, ++key);  // identity: a copy
  }
  // A view at an offset into a larger GPU tensor.
  const std::vector<float> flat = random_values(200, 399);
  const Tensor whole = Tensor::from_host(*e, Shape{200}, flat, Device::gpu(0));
  const Tensor x = whole.view(17, Shape{3, 4, 5});
  const std::vector<float> xv(flat.begin() + 17, flat.begin() + 77);
  expect_bits_equal(ops::permute(x, {2, 0, 1}).to_host(), pm_gather(xv, {3, 4, 5}, {2, 0, 1}), "view at 17");
  // By dims, then by their inverse: x again.
  const std::vector<float> v = random_values(2 * 5 * 3 * 4 * 8, 398);
  const Tensor q = Tensor::from_host(*e, Shape{2, 5, 3, 4, 8}, v, Device::gpu(0));
  const Tensor back = ops::permute(ops::permute(q, {2, 0, 3, 1, 4}), {1, 3, 0, 2, 4});
  CHECK(back.shape() == q.shape());
  expect_bits_equal(back.to_host(), v, "round trip");
  e->wait_all();
}
