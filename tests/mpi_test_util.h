// Helpers shared by the multi-process tests (every rank runs every case in
// the same order): values exact in float, references, and the message
// scenario of groups with two devices per process, on CPU devices and GPUs.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <exception>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "weft/engine.h"
#include "weft/parallel/collectives.h"
#include "weft/tensor.h"
#include "weft/tensor_op.h"

namespace mpi_test {

using weft::Device;
using weft::Engine;
using weft::Shape;
using weft::Tensor;
namespace par = weft::parallel;

// Member (or rank) m's value at element i: small integers, exact in float.
// A case about two or more ranks, run alone (ctest's parallel_mpi.np1):
// says so with the skip line and returns true. ctest runs it at np2 and np3.
inline bool alone(int ranks) {
  if (ranks > 1) return false;
  std::printf("[weft-skip] one rank: this case needs two or more (ctest runs it at np2 and np3)\n");
  std::fflush(stdout);
  return true;
}

inline float value(int member, std::int64_t i) { return static_cast<float>((member + 1) * (i % 7 + 1) - 3 * (i % 2)); }

inline Tensor rank_tensor(Engine& e, int member, std::int64_t n, Device d = Device::cpu(0)) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = value(member, i);
  return Tensor::from_host(e, Shape{n}, v, d);
}

// Element i of the reduction over members 0 .. size - 1.
inline float reduced(par::ReduceOp op, int size, std::int64_t i) {
  float acc = value(0, i);
  for (int r = 1; r < size; ++r) acc = op == par::ReduceOp::max ? std::max(acc, value(r, i)) : acc + value(r, i);
  return op == par::ReduceOp::average && size > 1 ? acc * (1.0f / static_cast<float>(size)) : acc;
}

inline std::string error_of(const Tensor& t) {
  try {
    (void)t.to_host();
  } catch (const std::exception& err) {
    return err.what();
  }
  return "(no error)";
}

// Every element as wanted; one assertion, naming the first element that is not.
template <class Want>
void require_values(const std::vector<float>& v, std::int64_t count, Want want) {
  REQUIRE(static_cast<std::int64_t>(v.size()) == count);
  for (std::int64_t i = 0; i < count; ++i)
    if (v[static_cast<std::size_t>(i)] != want(i)) {
      INFO("element " << i);
      REQUIRE(v[static_cast<std::size_t>(i)] == want(i));
    }
}
template <class Want>
void require_values(const Tensor& t, std::int64_t count, Want want) {
  require_values(t.to_host(), count, want);
}

// Every rank leaves a test case together (a fresh communicator's barrier).
inline void sync_ranks(Engine& e) {
  const par::Communicator comm = par::Communicator::mpi(e, Device::cpu(0));
  par::barrier(comm, {.name = "end of test case"});
  e.wait_all();
}

// Two rings over the members of a group with two devices per process, one
// forward (member m to m + 1: device 0 to device 1 in-process, device 1 to
// the next process's device 0) and one backward (m to m - 1: device 1 to
// device 0 in-process, device 0 to the previous process's device 1), each
// message stamped with its sender and round in its first element, the
// sender overwriting its tensor right after the send. Odd processes post
// their receives from other processes first: the naive engine completes
// each op within its push, as blocking MPI calls would.
inline void member_rings(Engine& e, const par::Communicator& comm, const std::vector<Device>& devices,
                         bool crossed_order) {
  const int n = comm.size(), per = 2, first = comm.local_ranks()[0], process = first / per;
  for (int step : {1, -1}) {
    for (std::int64_t count : {std::int64_t{1}, std::int64_t{1003}, std::int64_t{300007}}) {
      INFO("ring step " << step << ", " << count << " elements, " << n << " members");
      auto stamp = [&](int member, int round) { return static_cast<float>(1000 * member + round); };
      auto post_sends = [&](bool remote) {
        for (int k = 0; k < per; ++k) {
          const int me = first + k, to = ((me + step) % n + n) % n;
          if ((to / per != process) != remote) continue;
          for (int round = 0; round < 2; ++round) {
            std::vector<float> v(static_cast<std::size_t>(count));
            for (std::int64_t i = 0; i < count; ++i) v[static_cast<std::size_t>(i)] = value(me, i);
            v[0] = stamp(me, round);
            Tensor t = Tensor::from_host(e, Shape{count}, v, devices[static_cast<std::size_t>(k)]);
            par::send(comm, t, to, {.name = "act"});
            weft::push_tensor_op(devices[static_cast<std::size_t>(k)], {}, {t},
                                 [](weft::RunContext& ctx, const weft::TensorData& d) {
                                   weft::scale(ctx, d.out(0), -1.0f, 1);
                                 },
                                 {.name = "overwrite after send"});
          }
        }
      };
      std::vector<std::vector<Tensor>> got(2);
      auto post_recvs = [&](bool remote) {
        for (int k = 0; k < per; ++k) {
          const int me = first + k, from = ((me - step) % n + n) % n;
          if ((from / per != process) != remote) continue;
          for (int round = 0; round < 2; ++round) {
            Tensor t = Tensor::zeros(e, Shape{count}, devices[static_cast<std::size_t>(k)]);
            par::recv(comm, t, from, {.name = "act"});
            got[static_cast<std::size_t>(k)].push_back(t);
          }
        }
      };
      if (process % 2) {
        post_recvs(true);
        post_sends(true);
        post_sends(false);
        post_recvs(false);
      } else {
        post_sends(true);
        post_sends(false);
        post_recvs(true);
        post_recvs(false);
      }
      for (int k = 0; k < per; ++k) {
        const int me = first + k, from = ((me - step) % n + n) % n;
        for (int round = 0; round < 2; ++round)
        {
          INFO("member " << me << " from member " << from << ", round " << round);
          require_values(got[static_cast<std::size_t>(k)][static_cast<std::size_t>(round)], count,
                         [&](std::int64_t i) { return i == 0 ? stamp(from, round) : value(from, i); });
        }
      }
    }
  }
  // Every member to every member of the next process, received in the
  // reverse order of the sends: each pair of members has its own channel,
  // so the order between pairs does not matter (threaded engines only: the
  // naive one would wait forever in the first push, as blocking MPI would).
  const int processes = n / per;
  if (!crossed_order || processes < 2) return;
  const int next = (process + 1) % processes, previous = (process + processes - 1) % processes;
  std::vector<Tensor> got;
  for (int k = 0; k < per; ++k)
    for (int j = 0; j < per; ++j) {
      const int me = first + k, to = next * per + j;
      std::vector<float> v(17, static_cast<float>(1000 * me + to));
      par::send(comm, Tensor::from_host(e, Shape{17}, v, devices[static_cast<std::size_t>(k)]), to, {.name = "crossed"});
    }
  std::vector<std::pair<int, int>> pairs;  // (from, to), in the order received
  for (int j = per - 1; j >= 0; --j)
    for (int k = per - 1; k >= 0; --k) {
      const int me = first + j, from = previous * per + k;
      Tensor t = Tensor::zeros(e, Shape{17}, devices[static_cast<std::size_t>(j)]);
      par::recv(comm, t, from, {.name = "crossed"});
      got.push_back(t);
      pairs.emplace_back(from, me);
    }
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO("member " << pairs[i].second << " from member " << pairs[i].first);
    CHECK(got[i].to_host() == std::vector<float>(17, static_cast<float>(1000 * pairs[i].first + pairs[i].second)));
  }
}

}  // namespace mpi_test
