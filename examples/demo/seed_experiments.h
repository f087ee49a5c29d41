// The seeds' first experiments (Dive into Deep Learning, "Asynchronous
// Computation"), run on a Weft engine and timed.
#pragma once

#include <weft/engine.h>

namespace weft::demo {

struct AsyncDispatchResult {
  int ops = 0;
  double wait_each_s = 0;  // a wait_to_read after every push
  double wait_once_s = 0;  // one wait at the end
};
// `ops` times y = x + 1 on a small array, synchronously and asynchronously.
AsyncDispatchResult async_dispatch(Engine& engine, int ops, int elements);

struct MatmulResult {
  int products = 0;
  int n = 0;
  double push_s = 0;   // until the last push returned
  double total_s = 0;  // until wait_all returned
  double checksum = 0;
};
// `products` times (random n x n, then C = A * A) pushed, then wait_all.
MatmulResult async_matmuls(Engine& engine, int products, int n);

}  // namespace weft::demo
