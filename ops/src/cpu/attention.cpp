// Causal scaled dot-product attention, FlashAttention-2's algorithm on the
// CPU (docs/design/attention.md): scores are computed one block_q x block_k
// tile at a time and never held for the whole sequence.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "cpu/cpu_kernels.h"
#include "cpu/parallel.h"

namespace weft::kernels::cpu {

// Named, not anonymous: unity builds put this file beside other kernels.
namespace attention_detail {

constexpr std::int64_t kBlockQ = kAttentionBlock;
constexpr std::int64_t kBlockK = kAttentionBlock;

std::atomic<std::size_t> g_scratch_in_use{0};
std::atomic<std::size_t> g_scratch_peak{0};

// One worker's scratch for one piece of the work, counted while it lives.
class Scratch {
 public:
  explicit Scratch(std::size_t floats) : buf_(floats), bytes_(floats * sizeof(float)) {
    const std::size_t now = g_scratch_in_use.fetch_add(bytes_) + bytes_;
    std::size_t peak = g_scratch_peak.load();
    while (now > peak && !g_scratch_peak.compare_exchange_weak(peak, now)) {
    }
  }
  ~Scratch() { g_scratch_in_use.fetch_sub(bytes_); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() noexcept { return buf_.data(); }

 private:
  std::vector<float> buf_;
  std::size_t bytes_;
};

// s[i][j] = scale * q_i . k_j for rows [q0, q0 + nq) and keys [k0, k0 + nk)
// of one (b, h) plane, one sgemm (Q_tile K_tile^T); keys past the diagonal
// (j > i) get -inf.
void scores(float* s, const float* q, const float* k, std::int64_t q0, std::int64_t nq, std::int64_t k0,
            std::int64_t nk, std::int64_t d, float scale) {
  gemm(false, true, nq, nk, d, scale, q + q0 * d, d, k + k0 * d, d, 0.0f, s, kBlockK);
  if (k0 + nk - 1 <= q0) return;  // the whole tile is at or below the diagonal
  for (std::int64_t i = 0; i < nq; ++i) {
    float* si = s + i * kBlockK;
    for (std::int64_t j = std::max<std::int64_t>(q0 + i - k0 + 1, 0); j < nk; ++j)
      si[j] = -std::numeric_limits<float>::infinity();
  }
}

// p[i][j] = exp(s[i][j] - lse_i) in place (0 past the diagonal).
void probabilities(float* s, const float* lse, std::int64_t q0, std::int64_t nq, std::int64_t nk) {
  for (std::int64_t i = 0; i < nq; ++i) {
    float* si = s + i * kBlockK;
    const float l = lse[q0 + i];
    for (std::int64_t j = 0; j < nk; ++j) si[j] = std::exp(si[j] - l);  // exp(-inf) = 0
  }
}

// dp = dout_tile v_tile^T (one sgemm), then ds[i][j] = scale * p[i][j] *
// (dp[i][j] - delta_i) in place: 0 wherever p is (past the diagonal).
void score_grads(float* ds, const float* p, const float* dout, const float* v, const float* delta, std::int64_t q0,
                 std::int64_t nq, std::int64_t k0, std::int64_t nk, std::int64_t d, float scale) {
  gemm(false, true, nq, nk, d, 1.0f, dout + q0 * d, d, v + k0 * d, d, 0.0f, ds, kBlockK);
  for (std::int64_t i = 0; i < nq; ++i) {
    const float* pi = p + i * kBlockK;
    float* dsi = ds + i * kBlockK;
    const float di = delta[i];
    for (std::int64_t j = 0; j < nk; ++j) dsi[j] = pi[j] == 0.0f ? 0.0f : scale * (pi[j] * (dsi[j] - di));
  }
}

// delta_i = dout_i . out_i for rows [q0, q0 + nq).
void row_deltas(float* delta, const float* out, const float* dout, std::int64_t q0, std::int64_t nq, std::int64_t d) {
  for (std::int64_t i = 0; i < nq; ++i) {
    const float* oi = out + (q0 + i) * d;
    const float* doi = dout + (q0 + i) * d;
    float acc = 0.0f;
    for (std::int64_t c = 0; c < d; ++c) acc += oi[c] * doi[c];
    delta[i] = acc;
  }
}

std::int64_t blocks(std::int64_t n, std::int64_t block) { return (n + block - 1) / block; }

}  // namespace attention_detail

void causal_attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                              std::int64_t planes, std::int64_t t, std::int64_t d, float scale) {
  using namespace attention_detail;
  const std::int64_t nqb = blocks(t, kBlockQ);
  const std::int64_t items = planes * nqb;
  // An item costs about block_q x (its keys) x d x 2 multiply-adds.
  const std::int64_t cost = kBlockQ * std::max<std::int64_t>(t / 2, 1) * std::max<std::int64_t>(d, 1) * 2;
  detail::parallel_for(items, detail::grain_for(cost), [&](std::int64_t begin, std::int64_t end) {
    // s: block_q x block_k scores; acc: block_q x d; m, l: block_q each.
    Scratch scratch(static_cast<std::size_t>(kBlockQ * kBlockK + kBlockQ * d + 2 * kBlockQ));
    float* s = scratch.data();
    float* acc = s + kBlockQ * kBlockK;
    float* m = acc + kBlockQ * d;
    float* l = m + kBlockQ;
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t plane = item / nqb, qb = item % nqb;
      const std::int64_t off = plane * t * d;
      const float *qp = q + off, *kp = k + off, *vp = v + off;
      const std::int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, t - q0);
      std::fill(acc, acc + nq * d, 0.0f);
      std::fill(m, m + nq, -std::numeric_limits<float>::infinity());
      std::fill(l, l + nq, 0.0f);
      const std::int64_t last_key = q0 + nq - 1;  // the diagonal of the block's last row
      for (std::int64_t k0 = 0; k0 <= last_key; k0 += kBlockK) {
        const std::int64_t nk = std::min(kBlockK, last_key + 1 - k0);
        scores(s, qp, kp, q0, nq, k0, nk, d, scale);
        for (std::int64_t i = 0; i < nq; ++i) {
          float* si = s + i * kBlockK;
          float block_max = -std::numeric_limits<float>::infinity();
          for (std::int64_t j = 0; j < nk; ++j) block_max = std::max(block_max, si[j]);
          if (block_max == -std::numeric_limits<float>::infinity()) {  // all masked for this row
            std::fill(si, si + nk, 0.0f);
            continue;
          }
          const float m_new = std::max(m[i], block_max);
          const float correction = std::exp(m[i] - m_new);  // exp(-inf) = 0 on the first block
          float sum = 0.0f;
          for (std::int64_t j = 0; j < nk; ++j) {
            si[j] = std::exp(si[j] - m_new);
            sum += si[j];
          }
          l[i] = l[i] * correction + sum;
          m[i] = m_new;
          float* ai = acc + i * d;
          for (std::int64_t c = 0; c < d; ++c) ai[c] *= correction;
        }
        // acc += P_tile V_tile: one sgemm.
        gemm(false, false, nq, d, nk, 1.0f, s, kBlockK, vp + k0 * d, d, 1.0f, acc, d);
      }
      // Every row sees key 0, so l > 0.
      float* op = out + off;
      for (std::int64_t i = 0; i < nq; ++i) {
        const float inv = 1.0f / l[i];
        for (std::int64_t c = 0; c < d; ++c) op[(q0 + i) * d + c] = acc[i * d + c] * inv;
        lse[plane * t + q0 + i] = m[i] + std::log(l[i]);
      }
    }
  });
}

void causal_attention_backward(float* dq, float* dk, float* dv, const float* q, const float* k, const float* v,
                               const float* out, const float* dout, const float* lse, std::int64_t planes,
                               std::int64_t t, std::int64_t d, float scale) {
  using namespace attention_detail;
  const std::int64_t nb = blocks(t, kBlockQ);
  const std::int64_t items = planes * nb;
  const std::int64_t cost = kBlockQ * std::max<std::int64_t>(t / 2, 1) * std::max<std::int64_t>(d, 1) * 4;
  // Pass 1, per key block: dv_j = sum_i p_ij dout_i and dk_j = scale sum_i ds_ij q_i
  // over the query blocks at or below the diagonal. Each item owns its rows
  // of dk and dv.
  detail::parallel_for(items, detail::grain_for(cost), [&](std::int64_t begin, std::int64_t end) {
    Scratch scratch(static_cast<std::size_t>(2 * kBlockQ * kBlockK + kBlockQ));
    float* p = scratch.data();
    float* ds = p + kBlockQ * kBlockK;
    float* delta = ds + kBlockQ * kBlockK;
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t plane = item / nb, kb = item % nb;
      const std::int64_t off = plane * t * d;
      const float *qp = q + off, *kp = k + off, *vp = v + off, *op = out + off, *dop = dout + off;
      const float* lp = lse + plane * t;
      const std::int64_t k0 = kb * kBlockK, nk = std::min(kBlockK, t - k0);
      float* dkp = dk + off + k0 * d;
      float* dvp = dv + off + k0 * d;
      std::fill(dkp, dkp + nk * d, 0.0f);
      std::fill(dvp, dvp + nk * d, 0.0f);
      for (std::int64_t q0 = (k0 / kBlockQ) * kBlockQ; q0 < t; q0 += kBlockQ) {
        const std::int64_t nq = std::min(kBlockQ, t - q0);
        scores(p, qp, kp, q0, nq, k0, nk, d, scale);
        probabilities(p, lp, q0, nq, nk);
        row_deltas(delta, op, dop, q0, nq, d);
        score_grads(ds, p, dop, vp, delta, q0, nq, k0, nk, d, scale);
        // dv_tile += P^T dout_tile and dk_tile += dS^T q_tile: two sgemms.
        gemm(true, false, nk, d, nq, 1.0f, p, kBlockK, dop + q0 * d, d, 1.0f, dvp, d);
        gemm(true, false, nk, d, nq, 1.0f, ds, kBlockK, qp + q0 * d, d, 1.0f, dkp, d);
      }
    }
  });
  // Pass 2, per query block: dq_i = scale sum_j ds_ij k_j over the key blocks
  // up to the diagonal (scores recomputed; no atomics, the same bits for
  // every split of the work).
  detail::parallel_for(items, detail::grain_for(cost), [&](std::int64_t begin, std::int64_t end) {
    Scratch scratch(static_cast<std::size_t>(2 * kBlockQ * kBlockK + kBlockQ));
    float* p = scratch.data();
    float* ds = p + kBlockQ * kBlockK;
    float* delta = ds + kBlockQ * kBlockK;
    for (std::int64_t item = begin; item < end; ++item) {
      const std::int64_t plane = item / nb, qb = item % nb;
      const std::int64_t off = plane * t * d;
      const float *qp = q + off, *kp = k + off, *vp = v + off, *op = out + off, *dop = dout + off;
      const float* lp = lse + plane * t;
      const std::int64_t q0 = qb * kBlockQ, nq = std::min(kBlockQ, t - q0);
      float* dqp = dq + off + q0 * d;
      std::fill(dqp, dqp + nq * d, 0.0f);
      row_deltas(delta, op, dop, q0, nq, d);
      const std::int64_t last_key = q0 + nq - 1;
      for (std::int64_t k0 = 0; k0 <= last_key; k0 += kBlockK) {
        const std::int64_t nk = std::min(kBlockK, last_key + 1 - k0);
        scores(p, qp, kp, q0, nq, k0, nk, d, scale);
        probabilities(p, lp, q0, nq, nk);
        score_grads(ds, p, dop, vp, delta, q0, nq, k0, nk, d, scale);
        // dq_tile += dS k_tile: one sgemm.
        gemm(false, false, nq, d, nk, 1.0f, ds, kBlockK, kp + k0 * d, d, 1.0f, dqp, d);
      }
    }
  });
}

std::size_t attention_scratch_peak_bytes() noexcept { return attention_detail::g_scratch_peak.load(); }
void reset_attention_scratch_peak() noexcept {
  attention_detail::g_scratch_peak.store(attention_detail::g_scratch_in_use.load());
}

}  // namespace weft::kernels::cpu
