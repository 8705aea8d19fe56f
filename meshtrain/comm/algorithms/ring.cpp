// Ring algorithms: reduce-scatter and all-gather in size()-1 neighbour steps each.
#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "meshtrain/comm/algorithms/algorithms.h"

namespace meshtrain::comm::algorithms {
namespace {

// A step moves its block in pieces of at most this many bytes, so that the receive buffer stays
// small: a buffer the size of a whole block (32 MiB of a 64 MiB all-reduce on two ranks) was
// mapped, page-faulted and zeroed afresh by every operation, which made 64 MiB ten times slower
// per byte than 32 MiB (0.33 against 1.5 GB/s).
constexpr size_t kPieceBytes = size_t{4} << 20;

// Reduce-scatter over `blocks` (block b at offset off[b], len[b] elements) so that each rank r
// ends holding the full reduction of block r.
void ring_reduce_scatter_blocks(Exchange& ex, uint8_t* data, const std::vector<size_t>& off,
                                const std::vector<size_t>& len, DType dtype, ReduceOp op) {
  const int n = ex.size(), r = ex.rank();
  const size_t es = dtype_size(dtype);
  size_t max_len = 0;
  for (size_t l : len) max_len = std::max(max_len, l);
  // Every rank takes the same number of pieces per step (from the longest block), so that the
  // pieces of a step pair up across neighbours; the pieces past a shorter block's end are empty.
  const size_t piece = std::max<size_t>(1, std::min(max_len, kPieceBytes / es));
  const size_t pieces = std::max<size_t>(1, (max_len + piece - 1) / piece);
  auto tmp = std::make_unique_for_overwrite<uint8_t[]>(piece * es);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto part = [&](size_t block_len, size_t p) {
    const size_t lo = std::min(block_len, p * piece);
    return std::pair<size_t, size_t>(lo, std::min(block_len, lo + piece) - lo);
  };
  for (int s = 0; s < n - 1; ++s) {
    int sb = ((r - s - 1) % n + n) % n;
    int rb = ((r - s - 2) % n + n) % n;
    for (size_t p = 0; p < pieces; ++p) {
      const auto [s_lo, s_n] = part(len[sb], p);
      const auto [r_lo, r_n] = part(len[rb], p);
      ex.send_recv(right, data + (off[sb] + s_lo) * es, s_n * es, left, tmp.get(), r_n * es);
      reduce_into(data + (off[rb] + r_lo) * es, tmp.get(), r_n, dtype, op);
      ex.next_step();
    }
  }
}

void ring_all_gather_blocks(Exchange& ex, uint8_t* data, const std::vector<size_t>& off,
                            const std::vector<size_t>& len, size_t es) {
  const int n = ex.size(), r = ex.rank();
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  for (int s = 0; s < n - 1; ++s) {
    int sb = ((r - s) % n + n) % n;
    int rb = ((r - s - 1) % n + n) % n;
    ex.send_recv(right, data + off[sb] * es, len[sb] * es, left, data + off[rb] * es, len[rb] * es);
    ex.next_step();
  }
}

void even_blocks(size_t count, int n, std::vector<size_t>& off, std::vector<size_t>& len) {
  off.resize(n);
  len.resize(n);
  for (int b = 0; b < n; ++b) {
    off[b] = count * b / n;
    len[b] = count * (b + 1) / n - off[b];
  }
}

}  // namespace

void all_reduce_ring(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op) {
  if (ex.size() == 1) return;
  std::vector<size_t> off, len;
  even_blocks(count, ex.size(), off, len);
  auto* bytes = static_cast<uint8_t*>(data);
  ring_reduce_scatter_blocks(ex, bytes, off, len, dtype, op);
  ring_all_gather_blocks(ex, bytes, off, len, dtype_size(dtype));
}

void reduce_scatter_ring(Exchange& ex, const void* in, void* out, size_t count, DType dtype,
                         ReduceOp op) {
  const int n = ex.size();
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> work(static_cast<const uint8_t*>(in),
                            static_cast<const uint8_t*>(in) + count * n * es);
  std::vector<size_t> off(n), len(n, count);
  for (int b = 0; b < n; ++b) off[b] = count * b;
  ring_reduce_scatter_blocks(ex, work.data(), off, len, dtype, op);
  if (count > 0) std::memcpy(out, work.data() + off[ex.rank()] * es, count * es);
}

void all_gather_ring(Exchange& ex, const void* in, void* out, const std::vector<size_t>& counts,
                     size_t elem_bytes) {
  const int n = ex.size();
  std::vector<size_t> off(n, 0);
  for (int b = 1; b < n; ++b) off[b] = off[b - 1] + counts[b - 1];
  auto* bytes = static_cast<uint8_t*>(out);
  if (counts[ex.rank()] > 0) {
    std::memcpy(bytes + off[ex.rank()] * elem_bytes, in, counts[ex.rank()] * elem_bytes);
  }
  ring_all_gather_blocks(ex, bytes, off, counts, elem_bytes);
}

}  // namespace meshtrain::comm::algorithms
