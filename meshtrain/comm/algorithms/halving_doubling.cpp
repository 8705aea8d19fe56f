// Recursive halving-doubling all-reduce (Rabenseifner), latency O(log N) for small messages and
// near-ring bandwidth for large ones when N is a power of two.
#include <vector>

#include "meshtrain/comm/algorithms/algorithms.h"

namespace meshtrain::comm::algorithms {

void all_reduce_halving_doubling(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op) {
  const int n = ex.size(), r = ex.rank();
  if (n == 1) return;
  const size_t es = dtype_size(dtype);
  auto* bytes = static_cast<uint8_t*>(data);
  int p2 = 1;
  while (p2 * 2 <= n) p2 *= 2;
  const int extra = n - p2;
  std::vector<uint8_t> tmp(count * es);

  // Fold: rank p2 + i hands its data to rank i and waits for the result.
  if (r >= p2) {
    ex.send(r - p2, bytes, count * es)->wait();
    ex.next_step();
  } else {
    if (r < extra) {
      ex.recv(r + p2, tmp.data(), count * es)->wait();
      reduce_into(bytes, tmp.data(), count, dtype, op);
    }
    ex.next_step();
  }

  if (r < p2) {
    // Reduce-scatter by recursive halving; remember the ranges to undo them.
    size_t lo = 0, hi = count;
    std::vector<std::pair<size_t, size_t>> ranges;
    for (int d = p2 / 2; d >= 1; d /= 2) {
      const int partner = r ^ d;
      const size_t mid = lo + (hi - lo) / 2;
      ranges.push_back({lo, hi});
      size_t keep_lo = (r & d) ? mid : lo, keep_hi = (r & d) ? hi : mid;
      size_t give_lo = (r & d) ? lo : mid, give_hi = (r & d) ? mid : hi;
      ex.send_recv(partner, bytes + give_lo * es, (give_hi - give_lo) * es, partner, tmp.data(),
                   (keep_hi - keep_lo) * es);
      reduce_into(bytes + keep_lo * es, tmp.data(), keep_hi - keep_lo, dtype, op);
      lo = keep_lo;
      hi = keep_hi;
      ex.next_step();
    }
    // All-gather by recursive doubling, in reverse.
    for (int d = 1; d < p2; d *= 2) {
      const int partner = r ^ d;
      auto [plo, phi] = ranges.back();
      ranges.pop_back();
      size_t other_lo = lo == plo ? hi : plo, other_hi = lo == plo ? phi : lo;
      ex.send_recv(partner, bytes + lo * es, (hi - lo) * es, partner, bytes + other_lo * es,
                   (other_hi - other_lo) * es);
      lo = plo;
      hi = phi;
      ex.next_step();
    }
  } else {
    for (int d = 1; d < p2; d *= 2) ex.next_step();
    for (int d = p2 / 2; d >= 1; d /= 2) ex.next_step();
  }

  // Unfold.
  if (r >= p2) {
    ex.recv(r - p2, bytes, count * es)->wait();
  } else if (r < extra) {
    ex.send(r + p2, bytes, count * es)->wait();
  }
}

}  // namespace meshtrain::comm::algorithms
