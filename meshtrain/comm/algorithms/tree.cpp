// Binomial trees rooted anywhere: reduce up, broadcast down, log2(N) rounds.
#include <vector>

#include "meshtrain/comm/algorithms/algorithms.h"

namespace meshtrain::comm::algorithms {

void reduce_tree(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op, int root) {
  const int n = ex.size();
  if (n == 1) return;
  const int vr = (ex.rank() - root + n) % n;
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> tmp(count * es);
  for (int mask = 1; mask < n; mask <<= 1) {
    if (vr & mask) {
      ex.send((vr - mask + root) % n, data, count * es)->wait();
      return;
    }
    if (vr + mask < n) {
      ex.recv((vr + mask + root) % n, tmp.data(), count * es)->wait();
      reduce_into(data, tmp.data(), count, dtype, op);
    }
  }
}

void broadcast_tree(Exchange& ex, void* data, size_t bytes, int root) {
  const int n = ex.size();
  if (n == 1) return;
  const int vr = (ex.rank() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (vr & mask) {
      ex.recv((vr - mask + root) % n, data, bytes)->wait();
      break;
    }
    mask <<= 1;
  }
  std::vector<RequestPtr> sends;
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (vr + mask < n) sends.push_back(ex.send((vr + mask + root) % n, data, bytes));
  }
  wait_all(sends);
}

void all_reduce_tree(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op) {
  reduce_tree(ex, data, count, dtype, op, 0);
  ex.next_step();
  broadcast_tree(ex, data, count * dtype_size(dtype), 0);
}

}  // namespace meshtrain::comm::algorithms
