// ShmProcessGroup staged collectives: data moves through the staging buffers in steps, each
// step met by every rank, so that any buffer works (the in-place protocol needs shared ones).
#include "meshtrain/comm/process_group_shm.h"

#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <utility>

#include "meshtrain/comm/process_group_shm_layout.h"
#include "meshtrain/comm/process_group_shm_tuning.h"
#include "meshtrain/comm/process_group_shm_wait.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {

using namespace shm_internal;

namespace {

// How a large all-reduce of `count` elements is cut into steps of `step_elems` and each step into
// one slice per rank. Slices are cache-line aligned so that ranks never write the same line, and
// sit at the same place in every step (the last step may be short, and so its later slices).
struct StepSlices {
  StepSlices(size_t step, size_t total, int n, size_t es)
      : step_elems(step),
        count(total),
        per(round_up((std::min(step, total) + n - 1) / n, std::max<size_t>(1, kLine / es))) {}
  size_t steps() const { return (count + step_elems - 1) / step_elems; }
  size_t step_len(size_t k) const { return std::min(step_elems, count - k * step_elems); }
  // Rank q's slice [lo, hi) of a step of m elements, from the step's start.
  std::pair<size_t, size_t> slice(size_t m, int q) const {
    const size_t lo = std::min(m, per * static_cast<size_t>(q));
    return {lo, std::min(m, lo + per)};
  }
  size_t step_elems, count, per;
};

}  // namespace

void ShmProcessGroup::reduce_chunks(OpContext& ctx, void* data, size_t count, DType dtype,
                                    ReduceOp op, int root) {
  begin_op(ctx);
  const int n = size();
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dtype);
  const bool keep = root < 0 || root == rank();  // this rank ends with the result
  auto* bytes = static_cast<uint8_t*>(data);
  if (ctx.ticket >= 0 && all_reduce_in_place(ctx, data, count, dtype, op)) {
    return;
  }
  std::vector<const void*> srcs(n);
  if (n == 2 || count * es <= std::min(whole_bytes_, step_bytes_)) {
    // Small, or two ranks: one meeting per step, then every rank reduces the whole step in rank
    // order. With two ranks the slicing below saves nothing (each rank would still read the
    // other's whole step) and costs an extra copy: measured 3-5x slower at 1-64 MiB.
    const size_t step_elems = std::max<size_t>(1, step_bytes_ / es);
    for (size_t off = 0; off < count; off += step_elems) {
      const size_t m = std::min(step_elems, count - off);
      uint8_t* part = bytes + off * es;
      const uint64_t parity = chunk_counter_++;
      std::memcpy(buffer(rank(), parity), part, m * es);
      meet(ctx);
      if (keep) {
        for (int q = 0; q < n; ++q) srcs[q] = q == rank() ? part : buffer(q, parity);
        reduce_sources(part, srcs.data(), n, m, dtype, op, n);
      }
    }
    return;
  }
  // Large: reduce-scatter then all-gather through the staging buffers, one step at a time. Each
  // rank owns one slice of every step. It stages only the slices that the other ranks reduce,
  // reduces its own slice from its user buffer and their staged copies (in rank order, so every
  // rank's result has the same bits), and leaves the result in its own slice of its staging
  // buffer, from where the others copy it out. The phases of consecutive steps share a meeting:
  // after meeting k a rank reduces step k, copies out step k - 1 and stages step k + 1, in
  // buffers of alternating parity, so a step costs one meeting. Slice positions are the same in
  // every step (the last may be short), so that staging step k + 1 never overwrites the result
  // of step k - 1 that the others are still copying out.
  const StepSlices cut(std::max<size_t>(1, step_bytes_ / es), count, n, es);
  const size_t step_elems = cut.step_elems;
  const size_t steps = cut.steps();
  const uint64_t first = chunk_counter_;
  chunk_counter_ += steps;
  auto stage = [&](size_t k) {
    const size_t m = cut.step_len(k);
    auto [lo, hi] = cut.slice(m, rank());
    uint8_t* mine = buffer(rank(), first + k);
    const uint8_t* in = bytes + k * step_elems * es;
    if (lo > 0) std::memcpy(mine, in, lo * es);
    if (m > hi) std::memcpy(mine + hi * es, in + hi * es, (m - hi) * es);
  };
  auto reduce_own = [&](size_t k) {
    auto [lo, hi] = cut.slice(cut.step_len(k), rank());
    if (hi <= lo) return;
    uint8_t* user = bytes + (k * step_elems + lo) * es;
    uint8_t* result = buffer(rank(), first + k) + lo * es;
    for (int q = 0; q < n; ++q) srcs[q] = q == rank() ? user : buffer(q, first + k) + lo * es;
    if (root == rank()) {
      reduce_sources(user, srcs.data(), n, hi - lo, dtype, op, n);  // nobody copies it out
      return;
    }
    reduce_sources(result, srcs.data(), n, hi - lo, dtype, op, n);
    if (keep) std::memcpy(user, result, (hi - lo) * es);
  };
  auto copy_out = [&](size_t k) {
    if (!keep) return;
    const size_t m = cut.step_len(k);
    for (int q = 0; q < n; ++q) {
      auto [lo, hi] = cut.slice(m, q);
      if (q == rank() || hi <= lo) continue;
      std::memcpy(bytes + (k * step_elems + lo) * es, buffer(q, first + k) + lo * es,
                  (hi - lo) * es);
    }
  };
  stage(0);
  for (size_t k = 0; k < steps; ++k) {
    meet(ctx);
    reduce_own(k);
    if (k > 0) copy_out(k - 1);
    if (k + 1 < steps) stage(k + 1);
  }
  meet(ctx);
  copy_out(steps - 1);
}

void ShmProcessGroup::run_all_reduce(OpContext& ctx, void* data, size_t count, DType dtype,
                                     ReduceOp op) {
  reduce_chunks(ctx, data, count, dtype, op, -1);
}

void ShmProcessGroup::run_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
                                 int root) {
  reduce_chunks(ctx, data, count, dtype, op, root);
}

void ShmProcessGroup::run_broadcast(OpContext& ctx, void* data, size_t count, DType dtype,
                                    int root) {
  begin_op(ctx);
  const size_t es = dtype_size(dtype);
  const size_t chunk_elems = chunk_bytes_ / es;
  auto* bytes = static_cast<uint8_t*>(data);
  for (size_t off = 0; off < count; off += chunk_elems) {
    const size_t m = std::min(chunk_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    if (rank() == root) std::memcpy(buffer(root, parity), bytes + off * es, m * es);
    meet(ctx);
    if (rank() != root) std::memcpy(bytes + off * es, buffer(root, parity), m * es);
  }
}

void ShmProcessGroup::all_gather_chunks(OpContext& ctx, const void* input, void* output,
                                        const std::vector<size_t>& counts, DType dtype, int root) {
  begin_op(ctx);
  const int n = size();
  const size_t es = dtype_size(dtype);
  const size_t chunk_elems = chunk_bytes_ / es;
  std::vector<size_t> displs(n, 0);
  size_t max_count = 0;
  for (int q = 0; q < n; ++q) {
    if (q > 0) displs[q] = displs[q - 1] + counts[q - 1];
    max_count = std::max(max_count, counts[q]);
  }
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (size_t off = 0; off < max_count; off += chunk_elems) {
    const uint64_t parity = chunk_counter_++;
    auto part = [&](int q) { return counts[q] > off ? std::min(chunk_elems, counts[q] - off) : 0; };
    if (size_t m = part(rank()); m > 0) std::memcpy(buffer(rank(), parity), in + off * es, m * es);
    meet(ctx);
    if (root >= 0 && root != rank()) continue;
    for (int q = 0; q < n; ++q) {
      if (size_t m = part(q); m > 0) {
        const uint8_t* src = q == rank() ? in + off * es : buffer(q, parity);
        std::memcpy(out + (displs[q] + off) * es, src, m * es);
      }
    }
  }
}

void ShmProcessGroup::run_all_gather_v(OpContext& ctx, const void* input, void* output,
                                       const std::vector<size_t>& counts, DType dtype) {
  // A ticket only comes with the equal-count all_gather.
  if (ctx.ticket >= 0) {
    begin_op(ctx);
    if (all_gather_in_place(ctx, output, counts[0], dtype)) return;
  }
  all_gather_chunks(ctx, input, output, counts, dtype, -1);
}

void ShmProcessGroup::run_gather(OpContext& ctx, const void* input, void* output, size_t count,
                                 DType dtype, int root) {
  all_gather_chunks(ctx, input, output, std::vector<size_t>(size(), count), dtype, root);
}

void ShmProcessGroup::run_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                                  DType dtype, int root) {
  begin_op(ctx);
  const int n = size();
  const size_t es = dtype_size(dtype);
  const size_t chunk_elems = chunk_bytes_ / es;
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (size_t off = 0; off < count; off += chunk_elems) {
    const size_t m = std::min(chunk_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    if (rank() == root) {
      for (int q = 0; q < n; ++q) {
        if (q != root) std::memcpy(buffer(q, parity), in + (q * count + off) * es, m * es);
      }
      std::memcpy(out + off * es, in + (root * count + off) * es, m * es);
    }
    meet(ctx);
    if (rank() != root) std::memcpy(out + off * es, buffer(rank(), parity), m * es);
  }
}

void ShmProcessGroup::run_reduce_scatter(OpContext& ctx, const void* input, void* output,
                                         size_t count, DType dtype, ReduceOp op) {
  begin_op(ctx);
  if (ctx.ticket >= 0 && reduce_scatter_in_place(ctx, output, count, dtype, op)) return;
  const int n = size();
  const size_t es = dtype_size(dtype);
  // Each staging buffer holds one piece of every destination block.
  const size_t piece_elems = std::max<size_t>(1, (chunk_bytes_ / n) / es);
  const size_t piece_bytes = round_up(piece_elems * es, 1);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  std::vector<const void*> srcs(n);
  for (size_t off = 0; off < count; off += piece_elems) {
    const size_t m = std::min(piece_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    uint8_t* mine = buffer(rank(), parity);
    for (int q = 0; q < n; ++q) {
      std::memcpy(mine + q * piece_bytes, in + (q * count + off) * es, m * es);
    }
    meet(ctx);
    for (int s = 0; s < n; ++s) srcs[s] = buffer(s, parity) + rank() * piece_bytes;
    reduce_sources(out + off * es, srcs.data(), n, m, dtype, op, n);
  }
}

void ShmProcessGroup::run_all_to_all(OpContext& ctx, const void* input, void* output, size_t count,
                                     DType dtype) {
  begin_op(ctx);
  const int n = size();
  const size_t es = dtype_size(dtype);
  const size_t piece_elems = std::max<size_t>(1, (chunk_bytes_ / n) / es);
  const size_t piece_bytes = piece_elems * es;
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (size_t off = 0; off < count; off += piece_elems) {
    const size_t m = std::min(piece_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    uint8_t* mine = buffer(rank(), parity);
    for (int q = 0; q < n; ++q) {
      std::memcpy(mine + q * piece_bytes, in + (q * count + off) * es, m * es);
    }
    meet(ctx);
    for (int s = 0; s < n; ++s) {
      std::memcpy(out + (s * count + off) * es, buffer(s, parity) + rank() * piece_bytes, m * es);
    }
  }
}

void ShmProcessGroup::run_all_to_all_v(OpContext& ctx, const void* input,
                                       const std::vector<size_t>& send_counts, void* output,
                                       const std::vector<size_t>& recv_counts, DType dtype) {
  begin_op(ctx);
  const int n = size();
  const size_t es = dtype_size(dtype);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  // Every rank's send and receive counts, through the staging buffers: one meeting, after which
  // every rank knows the whole exchange. It checks every pair (so that all ranks fail alike on a
  // mismatch, before any data moves) and derives the same number of steps as the others.
  const size_t un = static_cast<size_t>(n);
  MT_CHECK(2 * un * sizeof(uint64_t) <= chunk_bytes_, "all_to_all_v: ", n,
           " ranks need more than a staging buffer for their counts");
  std::vector<uint64_t> sends(un * un), recvs(un * un);  // [s * n + q]: s to q, q from s
  if (n > 1) {
    const uint64_t parity = chunk_counter_++;
    auto* mine = reinterpret_cast<uint64_t*>(buffer(rank(), parity));
    for (size_t q = 0; q < un; ++q) {
      mine[q] = send_counts[q];
      mine[un + q] = recv_counts[q];
    }
    meet(ctx);
    for (int s = 0; s < n; ++s) {
      const auto* theirs = reinterpret_cast<const uint64_t*>(buffer(s, parity));
      std::memcpy(&sends[s * un], theirs, un * sizeof(uint64_t));
      std::memcpy(&recvs[s * un], theirs + un, un * sizeof(uint64_t));
    }
  } else {
    sends[0] = send_counts[0];
    recvs[0] = recv_counts[0];
  }
  for (size_t s = 0; s < un; ++s) {
    for (size_t q = 0; q < un; ++q) {
      if (sends[s * un + q] != recvs[q * un + s]) {
        MT_THROW(CommError, "all_to_all_v: rank ", s, " sends ", sends[s * un + q],
                 " elements to rank ", q, ", which expects ", recvs[q * un + s]);
      }
    }
  }
  // Where this rank's block for rank q starts in its input, and where rank s's block starts in
  // its output.
  std::vector<size_t> input_at(un), output_at(un);
  for (size_t q = 0, pos = 0; q < un; ++q) {
    input_at[q] = pos;
    pos += send_counts[q] * es;
  }
  for (size_t s = 0, pos = 0; s < un; ++s) {
    output_at[s] = pos;
    pos += recv_counts[s] * es;
  }
  const size_t me = static_cast<size_t>(rank());
  if (send_counts[me] > 0)
    std::memcpy(out + output_at[me], in + input_at[me], send_counts[me] * es);
  if (n == 1) return;
  // Each rank's blocks for the others, back to back, form one stream of bytes that goes through
  // its staging buffer a buffer's worth per step (so uneven counts still fill every step), and
  // each rank copies its block out of every other rank's stream. Its own block never leaves it.
  // stream_at[s * n + q]: where rank s's block for rank q starts in s's stream.
  std::vector<size_t> stream_at(un * un), stream_len(un, 0);
  for (size_t s = 0; s < un; ++s) {
    size_t pos = 0;
    for (size_t q = 0; q < un; ++q) {
      stream_at[s * un + q] = pos;
      if (q != s) pos += sends[s * un + q] * es;
    }
    stream_len[s] = pos;
  }
  const size_t longest = *std::max_element(stream_len.begin(), stream_len.end());
  const size_t steps = (longest + chunk_bytes_ - 1) / chunk_bytes_;
  for (size_t k = 0; k < steps; ++k) {
    const size_t lo = k * chunk_bytes_, hi = lo + chunk_bytes_;
    const uint64_t parity = chunk_counter_++;
    uint8_t* mine = buffer(rank(), parity);
    for (size_t q = 0; q < un; ++q) {
      if (q == me) continue;
      const size_t b0 = stream_at[me * un + q], b1 = b0 + send_counts[q] * es;
      const size_t from = std::max(lo, b0), to = std::min(hi, b1);
      if (from < to) std::memcpy(mine + (from - lo), in + input_at[q] + (from - b0), to - from);
    }
    meet(ctx);
    for (size_t s = 0; s < un; ++s) {
      if (s == me) continue;
      const size_t b0 = stream_at[s * un + me], b1 = b0 + recv_counts[s] * es;
      const size_t from = std::max(lo, b0), to = std::min(hi, b1);
      if (from < to) {
        std::memcpy(out + output_at[s] + (from - b0),
                    buffer(static_cast<int>(s), parity) + (from - lo), to - from);
      }
    }
  }
}

void ShmProcessGroup::run_barrier(OpContext& ctx) {
  begin_op(ctx);
  meet(ctx);
}

}  // namespace meshtrain::comm
