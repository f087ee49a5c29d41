// Causal attention's fused CUDA path: cuDNN's scaled-dot-product attention
// as a backend operation graph (docs/design/attention.md, "Fused path"),
// bfloat16 and float16, [B, H, T, D] contiguous. The graph is the one
// cudnn-frontend's composite SDPA node lowers to (whether cuDNN's fused
// engines accept it has not been seen on a GPU yet):
//
//   S = Q K^T (float32) -> * scale -> causal mask (row >= col, else -inf)
//   -> m = max_j S, E = exp(S - m), l = sum_j E, stats = m + log l
//   -> P = E / l (in the data's dtype) -> O = P V
//
// The stats are the op's lse (natural log-sum-exp of the scaled, masked
// scores). Plans are finalized from heuristic mode A's engine configs (the
// first one that finalizes with a workspace under 16 GiB wins; every
// descriptor it refers to is kept with it) in one cache per device, keyed by
// shape, dtype, scale, direction and the worker's cuDNN handle (a plan is
// finalized against a handle, and each worker runs its own); a key whose
// graph or plan cuDNN refuses is remembered as refused, so it is tried once.
// Every cudnnBackend* call goes through WEFT_CUDNN_CHECK.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "algorithm_cache.h"
#include "gpu_internal.h"
#include "gpu_kernels.h"
#include "weft/checked_call.h"
#include "weft/env.h"
#include "weft/error.h"

namespace weft::kernels::gpu {
namespace {

using i64 = std::int64_t;

// An owned cuDNN backend descriptor; every call checked.
class Backend {
 public:
  explicit Backend(cudnnBackendDescriptorType_t type) { WEFT_CUDNN_CHECK(cudnnBackendCreateDescriptor(type, &d_)); }
  ~Backend() {
    if (d_ != nullptr) (void)cudnnBackendDestroyDescriptor(d_);  // a failed destroy only leaks host memory
  }
  Backend(Backend&& other) noexcept : d_(std::exchange(other.d_, nullptr)) {}
  Backend& operator=(Backend&& other) noexcept {
    std::swap(d_, other.d_);
    return *this;
  }
  Backend(const Backend&) = delete;
  Backend& operator=(const Backend&) = delete;

  cudnnBackendDescriptor_t get() const noexcept { return d_; }
  void set(cudnnBackendAttributeName_t name, cudnnBackendAttributeType_t type, i64 count, const void* value) {
    WEFT_CUDNN_CHECK(cudnnBackendSetAttribute(d_, name, type, count, value));
  }
  void set_desc(cudnnBackendAttributeName_t name, const Backend& other) {
    cudnnBackendDescriptor_t o = other.get();
    set(name, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &o);
  }
  void finalize() { WEFT_CUDNN_CHECK(cudnnBackendFinalize(d_)); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};

using Dims = std::array<i64, 4>;

// Unique ids of the graph's non-virtual tensors (the variant pack's keys).
enum Uid : i64 {
  kUidQ = 1,
  kUidK,
  kUidV,
  kUidO,
  kUidStats,
  kUidScale,
  kUidNegInf,
  kUidDO,
  kUidDQ,
  kUidDK,
  kUidDV,
  kUidDQAccum,
  kUidSoftmaxSum,
  kUidOne,
  kUidVirtual = 100,  // virtual tensors from here on
};

struct Graph {
  // Deques: the references tensor() and virt() hand out stay valid as more
  // descriptors are added.
  std::deque<Backend> tensors;
  std::deque<Backend> ops;
  i64 next_uid = kUidVirtual;

  const Backend& tensor(i64 uid, cudnnDataType_t type, Dims dims, Dims strides, bool is_virtual,
                        bool by_value = false) {
    Backend t(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t.set(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &type);
    t.set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    t.set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    t.set(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    const i64 alignment = 16;
    t.set(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &alignment);
    t.set(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &is_virtual);
    if (by_value) t.set(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &by_value);
    t.finalize();
    tensors.push_back(std::move(t));
    return tensors.back();
  }
  const Backend& virt(cudnnDataType_t type, Dims dims, Dims strides) {
    return tensor(next_uid++, type, dims, strides, true);
  }
  const Backend& scalar(i64 uid) { return tensor(uid, CUDNN_DATA_FLOAT, {1, 1, 1, 1}, {1, 1, 1, 1}, false, true); }

  // y = mode(x[, b[, t]]) computed in `prec`; `axis` for GEN_INDEX.
  void pointwise(cudnnPointwiseMode_t mode, const Backend& x, const Backend* b, const Backend* t, const Backend& y,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, i64 axis = -1) {
    Backend pw(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw.set(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    pw.set(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) pw.set(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    pw.finalize();
    Backend op(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, pw);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, x);
    if (b != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, *b);
    if (t != nullptr) op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, *t);
    op.set_desc(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, y);
    op.finalize();
    ops.push_back(std::move(op));
  }
  // c = a b (batched over the first two dimensions), float32 accumulation.
  void matmul(const Backend& a, const Backend& b, const Backend& c) {
    Backend mm(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    mm.set(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    mm.finalize();
    Backend op(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_ADESC, a);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_BDESC, b);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_CDESC, c);
    op.set_desc(CUDNN_ATTR_OPERATION_MATMUL_DESC, mm);
    op.finalize();
    ops.push_back(std::move(op));
  }
  // y = x under y's dimensions and strides (a transposed view).
  void reshape(const Backend& x, const Backend& y) {
    Backend op(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, y);
    op.finalize();
    ops.push_back(std::move(op));
  }
  // y = reduce(x) over the dimensions where y has size 1.
  void reduction(cudnnReduceTensorOp_t mode, const Backend& x, const Backend& y) {
    Backend red(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    const cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    red.set(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    red.set(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    red.finalize();
    Backend op(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, x);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, y);
    op.set_desc(CUDNN_ATTR_OPERATION_REDUCTION_DESC, red);
    op.finalize();
    ops.push_back(std::move(op));
  }
};

// The shapes of one problem.
struct Geometry {
  i64 b, h, t, d;
  Dims bhtd() const { return {b, h, t, d}; }
  Dims bhtd_strides() const { return {h * t * d, t * d, d, 1}; }
  Dims bhdt() const { return {b, h, d, t}; }  // a [B, H, T, D] tensor read transposed
  Dims bhdt_strides() const { return {h * t * d, t * d, 1, d}; }
  Dims scores() const { return {b, h, t, t}; }
  Dims scores_strides() const { return {h * t * t, t * t, t, 1}; }
  Dims rows() const { return {b, h, t, 1}; }
  Dims rows_strides() const { return {h * t, t, 1, 1}; }
};

// Entries past the diagonal (col > row) of `x` become -inf: GEN_INDEX rows
// (axis 2) and columns (axis 3) in int32, CMP_GE into a boolean, then
// BINARY_SELECT(x, -inf, keep).
const Backend& causal_mask(Graph& g, const Geometry& s, const Backend& x, const Backend& neg_inf) {
  const Backend& row = g.virt(CUDNN_DATA_INT32, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, row, CUDNN_DATA_FLOAT, 2);
  const Backend& col = g.virt(CUDNN_DATA_INT32, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_GEN_INDEX, x, nullptr, nullptr, col, CUDNN_DATA_FLOAT, 3);
  const Backend& keep = g.virt(CUDNN_DATA_BOOLEAN, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_CMP_GE, row, &col, nullptr, keep, CUDNN_DATA_BOOLEAN);
  const Backend& masked = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_BINARY_SELECT, x, &neg_inf, &keep, masked);
  return masked;
}

// The forward graph (the file comment's sequence).
void build_forward(Graph& g, const Geometry& s, cudnnDataType_t type) {
  const Backend& q = g.tensor(kUidQ, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& kt = g.tensor(kUidK, type, s.bhdt(), s.bhdt_strides(), false);
  const Backend& v = g.tensor(kUidV, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& o = g.tensor(kUidO, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& stats = g.tensor(kUidStats, CUDNN_DATA_FLOAT, s.rows(), s.rows_strides(), false);
  const Backend& scale = g.scalar(kUidScale);
  const Backend& neg_inf = g.scalar(kUidNegInf);
  const Backend& scores = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.matmul(q, kt, scores);
  const Backend& scaled = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, scores, &scale, nullptr, scaled);
  const Backend& masked = causal_mask(g, s, scaled, neg_inf);
  const Backend& m = g.virt(CUDNN_DATA_FLOAT, s.rows(), s.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, masked, m);
  const Backend& shifted = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, masked, &m, nullptr, shifted);
  const Backend& e = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_EXP, shifted, nullptr, nullptr, e);
  const Backend& l = g.virt(CUDNN_DATA_FLOAT, s.rows(), s.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, l);
  const Backend& log_l = g.virt(CUDNN_DATA_FLOAT, s.rows(), s.rows_strides());
  g.pointwise(CUDNN_POINTWISE_LOG, l, nullptr, nullptr, log_l);
  g.pointwise(CUDNN_POINTWISE_ADD, m, &log_l, nullptr, stats);
  // P enters the second matmul in the data's dtype, as the fused engines want.
  const Backend& p = g.virt(type, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_DIV, e, &l, nullptr, p);
  g.matmul(p, v, o);
}

// The backward graph from the saved stats (natural log-sum-exp), in the
// order of cudnn-frontend's composite backward node (no dropout, no bias):
//   softmax_sum = rowsum(dO * O) * 1        (float32, non-virtual)
//   P  = exp(mask(scale Q K^T - stats))     (masked after the subtraction)
//   dV = reshape(P)^T dO                    (P^T in the dtype)
//   dS = (dO V^T - softmax_sum) * P * scale (float32)
//   dK = reshape(dS)^T Q                    (dS^T in the dtype)
//   dQ = identity(dS K) through a float32 accumulator (non-virtual)
// K and V come in as [B, H, D, T] views (swapped strides), K reshaped back
// to [B, H, T, D] for dQ.
void build_backward(Graph& g, const Geometry& s, cudnnDataType_t type) {
  const Backend& q = g.tensor(kUidQ, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& kt = g.tensor(kUidK, type, s.bhdt(), s.bhdt_strides(), false);
  const Backend& vt = g.tensor(kUidV, type, s.bhdt(), s.bhdt_strides(), false);
  const Backend& o = g.tensor(kUidO, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& dout = g.tensor(kUidDO, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& stats = g.tensor(kUidStats, CUDNN_DATA_FLOAT, s.rows(), s.rows_strides(), false);
  const Backend& dq = g.tensor(kUidDQ, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& dk = g.tensor(kUidDK, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& dv = g.tensor(kUidDV, type, s.bhtd(), s.bhtd_strides(), false);
  const Backend& softmax_sum = g.tensor(kUidSoftmaxSum, CUDNN_DATA_FLOAT, s.rows(), s.rows_strides(), false);
  const Backend& dq_accum = g.tensor(kUidDQAccum, CUDNN_DATA_FLOAT, s.bhtd(), s.bhtd_strides(), false);
  const Backend& scale = g.scalar(kUidScale);
  const Backend& neg_inf = g.scalar(kUidNegInf);
  const Backend& one = g.scalar(kUidOne);

  const Backend& prod = g.virt(CUDNN_DATA_FLOAT, s.bhtd(), s.bhtd_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, dout, &o, nullptr, prod);
  const Backend& row_sum = g.virt(CUDNN_DATA_FLOAT, s.rows(), s.rows_strides());
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, prod, row_sum);
  g.pointwise(CUDNN_POINTWISE_MUL, row_sum, &one, nullptr, softmax_sum);

  const Backend& scores = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.matmul(q, kt, scores);
  const Backend& scaled = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, scores, &scale, nullptr, scaled);
  const Backend& shifted = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, scaled, &stats, nullptr, shifted);
  const Backend& masked = causal_mask(g, s, shifted, neg_inf);
  const Backend& p = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_EXP, masked, nullptr, nullptr, p);

  const Dims transposed{s.h * s.t * s.t, s.t * s.t, 1, s.t};
  const Backend& p_t = g.virt(type, s.scores(), transposed);
  g.reshape(p, p_t);
  g.matmul(p_t, dout, dv);

  const Backend& dp = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.matmul(dout, vt, dp);
  const Backend& centered = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_SUB, dp, &softmax_sum, nullptr, centered);
  const Backend& weighted = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, centered, &p, nullptr, weighted);
  const Backend& ds = g.virt(CUDNN_DATA_FLOAT, s.scores(), s.scores_strides());
  g.pointwise(CUDNN_POINTWISE_MUL, weighted, &scale, nullptr, ds);

  const Backend& ds_t = g.virt(type, s.scores(), transposed);
  g.reshape(ds, ds_t);
  g.matmul(ds_t, q, dk);

  const Backend& k = g.virt(type, s.bhtd(), s.bhtd_strides());
  g.reshape(kt, k);
  g.matmul(ds, k, dq_accum);
  g.pointwise(CUDNN_POINTWISE_IDENTITY, dq_accum, nullptr, nullptr, dq);
}

// Every descriptor of one plan, kept for the plan's lifetime: the graph's
// tensors and operations, the operation graph, the heuristics' engine
// configs and the execution plan (cuDNN is not relied on to have copied
// what the plan refers to).
struct Kept {
  Graph graph;
  std::optional<Backend> op_graph, heur, plan;
  std::vector<Backend> configs;
};

// One finalized plan, or cuDNN's refusal.
struct FusedPlan {
  std::shared_ptr<Kept> kept;  // null when refused
  i64 workspace = 0;           // cuDNN's own workspace, bytes
  i64 extra = 0;               // backward: softmax_sum and dq_accum, bytes (after cuDNN's, 256-aligned)
  std::string refusal;         // why cuDNN refused (its status text)
};

// b, h, t, d, dtype, scale bits, direction, cuDNN handle.
using FusedKey = std::array<i64, 8>;
using FusedCache = AlgorithmCache<FusedKey, FusedPlan>;

FusedCache& fused_plans(const WorkerHandles& h) {
  static std::mutex mu;
  static std::map<int, std::unique_ptr<FusedCache>> caches;
  std::lock_guard lock(mu);
  std::unique_ptr<FusedCache>& c = caches[h.device.index()];
  if (!c) c = std::make_unique<FusedCache>(algorithm_cache_size_from_env());
  return *c;
}

cudnnDataType_t half_type(DType dt) { return dt == DType::bfloat16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF; }

i64 align256(i64 n) { return (n + 255) / 256 * 256; }

// A plan wanting more workspace than this (16 GiB) is passed over: a
// corrupt size must not reach the allocator as a huge request.
constexpr i64 kFusedAttentionMaxWorkspace = i64{16} << 30;

FusedPlan make_fused_plan(const WorkerHandles& h, DType dt, const Geometry& s, bool backward) {
  FusedPlan out;
  try {
    auto kept = std::make_shared<Kept>();
    Graph& g = kept->graph;
    if (backward)
      build_backward(g, s, half_type(dt));
    else
      build_forward(g, s, half_type(dt));
    Backend& graph = kept->op_graph.emplace(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    std::vector<cudnnBackendDescriptor_t> raw;
    raw.reserve(g.ops.size());
    for (const Backend& op : g.ops) raw.push_back(op.get());
    graph.set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, static_cast<i64>(raw.size()), raw.data());
    graph.finalize();

    Backend& heur = kept->heur.emplace(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    heur.set_desc(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, graph);
    const cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_A;
    heur.set(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &mode);
    heur.finalize();
    i64 count = 0;
    WEFT_CUDNN_CHECK(
        cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                                 nullptr));
    if (count <= 0) {
      out.refusal = "cuDNN's heuristics (mode A) offer no engine for the graph";
      return out;
    }
    std::vector<Backend>& configs = kept->configs;
    std::vector<cudnnBackendDescriptor_t> config_raw;
    for (i64 i = 0; i < count; ++i) {
      configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
      config_raw.push_back(configs.back().get());
    }
    i64 got = 0;
    WEFT_CUDNN_CHECK(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                              CUDNN_TYPE_BACKEND_DESCRIPTOR, count, &got, config_raw.data()));
    std::string last = "no engine config finalized";
    for (i64 i = 0; i < got && i < count; ++i) {
      try {
        Backend& plan = kept->plan.emplace(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
        cudnnHandle_t handle = h.cudnn;
        plan.set(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &handle);
        plan.set_desc(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, configs[static_cast<std::size_t>(i)]);
        plan.finalize();
        i64 ws = -1;
        i64 n = 0;
        WEFT_CUDNN_CHECK(cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                  CUDNN_TYPE_INT64, 1, &n, &ws));
        if (n != 1 || ws < 0 || ws > kFusedAttentionMaxWorkspace) {
          last = "engine config " + std::to_string(i) + " wants a workspace of " + std::to_string(ws) + " bytes";
          kept->plan.reset();
          continue;
        }
        out.workspace = ws;
        if (backward) out.extra = align256(s.b * s.h * s.t * 4) + align256(s.b * s.h * s.t * s.d * 4);
        out.kept = std::move(kept);
        return out;
      } catch (const weft::Error& e) {
        kept->plan.reset();
        last = e.what();
      }
    }
    out.refusal = "no engine config of " + std::to_string(got) + " finalized (last: " + last + ")";
  } catch (const weft::Error& e) {
    out.refusal = e.what();
  }
  return out;
}

std::string shape_text(DType dt, const Geometry& s, float scale) {
  return "[" + std::to_string(s.b) + ", " + std::to_string(s.h) + ", " + std::to_string(s.t) + ", " +
         std::to_string(s.d) + "] " + std::string(to_string(dt)) + " scale " + std::to_string(scale);
}

}  // namespace

AttentionImpl attention_impl_from_env() {
  const std::string_view v = weft::env::choice_or(kAttentionImplVariable, "auto", {"auto", "fused", "gemm"});
  return v == "fused" ? AttentionImpl::fused : v == "gemm" ? AttentionImpl::gemm : AttentionImpl::automatic;
}

std::string fused_attention_unsupported(DType dt, std::int64_t d) {
  if (dt != DType::bfloat16 && dt != DType::float16)
    return "dtype " + std::string(to_string(dt)) + " (the fused path takes bfloat16 and float16)";
  if (d % 8 != 0 || d < 8 || d > kFusedAttentionMaxHeadWidth)
    return "head width D = " + std::to_string(d) + " (the fused path takes multiples of 8 up to " +
           std::to_string(kFusedAttentionMaxHeadWidth) + ")";
  return {};
}

std::optional<FusedAttention> fused_attention_plan(const WorkerHandles& h, DType dt, bool backward, std::int64_t b,
                                                   std::int64_t heads, std::int64_t t, std::int64_t d, float scale,
                                                   AttentionImpl impl, bool aligned) {
  const char* op = backward ? "causal_attention_backward" : "causal_attention";
  if (impl == AttentionImpl::gemm) return std::nullopt;
  const Geometry s{b, heads, t, d};
  std::string why = fused_attention_unsupported(dt, d);
  if (why.empty() && h.cudnn == nullptr) why = "no cuDNN handle on this worker";
  if (why.empty() && !aligned) why = "a tensor whose address is not a multiple of 16 bytes (a view at an offset)";
  if (why.empty() && (b <= 0 || heads <= 0 || t <= 0)) why = "an empty tensor";
  if (why.empty()) {
    std::uint32_t bits = 0;
    std::memcpy(&bits, &scale, sizeof bits);
    const FusedKey key{b, heads, t, d, static_cast<i64>(dt), static_cast<i64>(bits), backward ? 1 : 0,
                       static_cast<i64>(reinterpret_cast<std::uintptr_t>(h.cudnn))};
    const auto build = [&] { return make_fused_plan(h, dt, s, backward); };
    // Plans are finalized without trial runs, so capture changes nothing:
    // the same builder serves both ways.
    FusedPlan plan = fused_plans(h).get(key, false, build, build);
    if (plan.kept) {
      FusedAttention f;
      f.plan = std::shared_ptr<void>(plan.kept, plan.kept->plan->get());
      f.cudnn_workspace = static_cast<std::size_t>(plan.workspace);
      f.workspace_bytes = static_cast<std::size_t>(align256(plan.workspace) + plan.extra);
      return f;
    }
    why = "cuDNN refused the graph: " + plan.refusal;
  }
  if (impl == AttentionImpl::fused)
    throw weft::Error(std::string(op) + ": " + kAttentionImplVariable + "=fused, but the fused cuDNN path is not "
                      "available for " + shape_text(dt, s, scale) + ": " + why);
  return std::nullopt;
}

namespace {

void execute(const WorkerHandles& h, const FusedAttention& f, std::vector<i64> uids, std::vector<void*> ptrs,
             void* workspace) {
  Backend pack(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  pack.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, static_cast<i64>(ptrs.size()), ptrs.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, static_cast<i64>(uids.size()), uids.data());
  pack.set(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
  pack.finalize();
  WEFT_CUDNN_CHECK(cudnnBackendExecute(h.cudnn, static_cast<cudnnBackendDescriptor_t>(f.plan.get()), pack.get()));
}

}  // namespace

void causal_attention_fused_forward(const WorkerHandles& h, const FusedAttention& f, void* out, float* lse,
                                    const void* q, const void* k, const void* v, float scale, void* workspace) {
  float scale_value = scale;
  float neg_inf = -std::numeric_limits<float>::infinity();
  execute(h, f, {kUidQ, kUidK, kUidV, kUidO, kUidStats, kUidScale, kUidNegInf},
          {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), out, lse, &scale_value, &neg_inf},
          workspace);
}

void causal_attention_fused_backward(const WorkerHandles& h, const FusedAttention& f, void* dq, void* dk, void* dv,
                                     const void* q, const void* k, const void* v, const void* out, const void* dout,
                                     const float* lse, std::int64_t b, std::int64_t heads, std::int64_t t,
                                     float scale, void* workspace) {
  float scale_value = scale;
  float neg_inf = -std::numeric_limits<float>::infinity();
  unsigned char* base = static_cast<unsigned char*>(workspace);
  const i64 cudnn_part = align256(static_cast<i64>(f.cudnn_workspace));
  void* softmax_sum = base + cudnn_part;
  void* dq_accum = base + cudnn_part + align256(b * heads * t * 4);
  // dq_accum is summed into: it starts at zero.
  WEFT_CUDA_CHECK(cudaMemsetAsync(dq_accum, 0, f.workspace_bytes - static_cast<std::size_t>(cudnn_part) -
                                                   static_cast<std::size_t>(align256(b * heads * t * 4)),
                                  detail::cuda_stream(h)));
  float one = 1.0f;
  execute(h, f,
          {kUidQ, kUidK, kUidV, kUidO, kUidDO, kUidStats, kUidDQ, kUidDK, kUidDV, kUidSoftmaxSum, kUidDQAccum,
           kUidScale, kUidNegInf, kUidOne},
          {const_cast<void*>(q), const_cast<void*>(k), const_cast<void*>(v), const_cast<void*>(out),
           const_cast<void*>(dout), const_cast<float*>(lse), dq, dk, dv, softmax_sum, dq_accum, &scale_value,
           &neg_inf, &one},
          workspace);
}

}  // namespace weft::kernels::gpu
