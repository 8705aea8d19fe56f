// ShmProcessGroup in-place collectives on buffers from allocate_buffer: the issue, arrive,
// enter, part, wait and leave sequence over the slots, in which whichever rank runs the operation
// claims chunks of it, so that no staging copies or meetings are needed.
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

ShmProcessGroup::Slot* ShmProcessGroup::slot(uint64_t ticket) const {
  return reinterpret_cast<Slot*>(segment_.data() + slots_offset_ +
                                 slot_stride_ * static_cast<size_t>(ticket % kSlots));
}

ShmProcessGroup::Arrival* ShmProcessGroup::arrival(Slot* s, int rank) const {
  return reinterpret_cast<Arrival*>(reinterpret_cast<uint8_t*>(s) + sizeof(Slot)) + rank;
}

void ShmProcessGroup::signal() {
  header_->signal.fetch_add(1, std::memory_order_release);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&header_->signal);
}

int64_t ShmProcessGroup::on_issue_all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  return issue_in_place(InPlaceKind::all_reduce, data, count, dtype, op);
}

int64_t ShmProcessGroup::on_issue_reduce_scatter(const void* input, size_t count, DType dtype,
                                                 ReduceOp op) {
  return issue_in_place(InPlaceKind::reduce_scatter, input, count * static_cast<size_t>(size()),
                        dtype, op);
}

int64_t ShmProcessGroup::on_issue_all_gather(const void* input, void* output, size_t count,
                                             DType dtype) {
  // Peers read this rank's block where the output holds it: only an all-gather whose input is
  // its own block of the output (ZeRO's in-place gathers) can be shared.
  const bool own_block =
      input == static_cast<const uint8_t*>(output) + rank() * count * dtype_size(dtype);
  return issue_in_place(InPlaceKind::all_gather, own_block ? output : nullptr,
                        count * static_cast<size_t>(size()), dtype, ReduceOp::sum);
}

int64_t ShmProcessGroup::issue_in_place(InPlaceKind kind, const void* buffer, size_t count,
                                        DType dtype, ReduceOp op) {
  // The same decision on every rank: the same operations, sizes and allocate_buffer calls
  // (where this rank's buffer lies is announced, not decided here).
  if (size() == 1 || count * dtype_size(dtype) < shared_min_bytes_ ||
      !has_regions_.load(std::memory_order_acquire)) {
    return -1;
  }
  Pending p;
  p.ticket = tickets_issued_++;
  p.kind = kind;
  if (buffer != nullptr) p.region = find_region(buffer, count * dtype_size(dtype), &p.offset);
  p.count = count;
  p.dtype = dtype;
  p.op = op;
  // Announced now, on the issuing thread: the data is ready, and the ranks that reach the
  // operation later find everything they need to run it without waiting for this one.
  Slot* s = slot(p.ticket);
  if (s->open_round.load(std::memory_order_acquire) == p.ticket / kSlots) {
    arrive(p);
    p.arrived = true;
  }
  std::lock_guard<std::mutex> lock(pending_mu_);
  pending_.push_back(std::move(p));
  return static_cast<int64_t>(pending_.back().ticket);
}

std::chrono::microseconds ShmProcessGroup::leave_to_issuer(const OpContext& ctx) const {
  if (ctx.ticket >= 0 && in_place_leave_) return *in_place_leave_;
  return ProcessGroupBase::leave_to_issuer(ctx);
}

void ShmProcessGroup::arrive(const Pending& p) {
  const int n = size();
  Slot* s = slot(p.ticket);
  Arrival* mine = arrival(s, rank());
  mine->region = p.region ? p.region->id : 0;
  mine->offset = p.offset;
  mine->count = p.count;
  mine->dtype = static_cast<uint32_t>(p.dtype);
  mine->op = static_cast<uint32_t>(p.op);
  mine->kind = static_cast<uint32_t>(p.kind);
  if (s->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1 != static_cast<uint32_t>(n)) return;
  // Last to arrive: in place only when every rank's buffer lies in the same allocation (and
  // they agree on the operation), else every rank stages.
  bool same = p.region != nullptr;
  const size_t es = dtype_size(p.dtype);
  for (int q = 0; q < n && same; ++q) {
    const Arrival* a = arrival(s, q);
    same = a->region == mine->region && a->count == p.count && a->dtype == mine->dtype &&
           a->op == mine->op && a->kind == mine->kind &&
           a->offset + p.count * es <= p.region->maps[q].size();
  }
  s->verdict.store(same ? 1 : 2, std::memory_order_release);
  signal();
}

bool ShmProcessGroup::enter_in_place(OpContext& ctx, Pending& p, std::vector<uint8_t*>& base) {
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    MT_CHECK(!pending_.empty() && pending_.front().ticket == static_cast<uint64_t>(ctx.ticket),
             "in-place collectives ran out of issue order");
    p = std::move(pending_.front());
    pending_.pop_front();
  }
  const int n = size();
  Slot* s = slot(p.ticket);
  const uint64_t round = p.ticket / kSlots;
  std::vector<int> others;
  for (int q = 0; q < n; ++q) {
    if (q != rank()) others.push_back(q);
  }
  if (!p.arrived) {
    wait_until(
        ctx, &header_->signal,
        [&] { return s->open_round.load(std::memory_order_acquire) == round; }, others,
        "in-place collective: an earlier one still running");
    arrive(p);
  }
  wait_until(
      ctx, &header_->signal, [&] { return s->verdict.load(std::memory_order_acquire) != 0; },
      others, "in-place collective: buffers not announced");
  const bool in_place = s->verdict.load(std::memory_order_acquire) == 1;
  base.assign(static_cast<size_t>(n), nullptr);
  if (in_place)
    for (int q = 0; q < n; ++q) base[q] = p.region->maps[q].data() + arrival(s, q)->offset;
  return in_place;
}

void ShmProcessGroup::wait_in_place_done(OpContext& ctx, const Pending& p, uint32_t need,
                                         const char* what) {
  Slot* s = slot(p.ticket);
  std::vector<int> others;
  for (int q = 0; q < size(); ++q) {
    if (q != rank()) others.push_back(q);
  }
  wait_until(
      ctx, &header_->signal, [&] { return s->chunks_done.load(std::memory_order_acquire) >= need; },
      others, what);
}

void ShmProcessGroup::leave_in_place(const Pending& p) {
  Slot* s = slot(p.ticket);
  const uint64_t round = p.ticket / kSlots;
  if (s->left.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size())) {
    s->arrivals.store(0, std::memory_order_relaxed);
    s->verdict.store(0, std::memory_order_relaxed);
    s->next_chunk.store(0, std::memory_order_relaxed);
    s->chunks_done.store(0, std::memory_order_relaxed);
    s->left.store(0, std::memory_order_relaxed);
    s->open_round.store(round + 1, std::memory_order_release);
    signal();
  }
}

bool ShmProcessGroup::all_reduce_in_place(OpContext& ctx, void* data, size_t count, DType dtype,
                                          ReduceOp op) {
  Pending p;
  std::vector<uint8_t*> base;
  const bool in_place = enter_in_place(ctx, p, base);
  if (in_place) {
    // Every rank's buffer is ready (announced), and stays untouched by its owner until that rank
    // has seen every chunk done. A chunk's claimer reduces it from all buffers in rank order
    // (the same bits as the staged path) into its own buffer and copies the result into the
    // others'. Ranks that wait for a peer still in backward thus do the work meanwhile.
    const int n = size();
    Slot* s = slot(p.ticket);
    const size_t es = dtype_size(dtype);
    auto* mine = static_cast<uint8_t*>(data);
    const size_t chunk = std::max<size_t>(1, shared_chunk_bytes_ / es);
    const auto chunks = static_cast<uint32_t>((count + chunk - 1) / chunk);
    std::vector<const void*> srcs(n);
    for (;;) {
      const uint32_t c = s->next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) break;
      const size_t lo = c * chunk, len = std::min(chunk, count - lo);
      for (int q = 0; q < n; ++q) srcs[q] = base[q] + lo * es;
      reduce_sources(mine + lo * es, srcs.data(), n, len, dtype, op, n);
      for (int q = 0; q < n; ++q) {
        if (q != rank()) std::memcpy(base[q] + lo * es, mine + lo * es, len * es);
      }
      in_place_chunks_.fetch_add(1, std::memory_order_relaxed);
      if (s->chunks_done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) signal();
    }
    wait_in_place_done(ctx, p, chunks, "in-place all-reduce: chunks claimed by peers");
  }
  leave_in_place(p);
  if (in_place) in_place_all_reduces_.fetch_add(1, std::memory_order_relaxed);
  return in_place;
}

bool ShmProcessGroup::run_in_place_part(
    OpContext& ctx, const char* what,
    const std::function<void(const std::vector<uint8_t*>&)>& part) {
  Pending p;
  std::vector<uint8_t*> base;
  const bool in_place = enter_in_place(ctx, p, base);
  if (in_place) {
    part(base);
    // The buffers stay untouched by their owners until every rank has done its part.
    const auto n = static_cast<uint32_t>(size());
    if (slot(p.ticket)->chunks_done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) signal();
    wait_in_place_done(ctx, p, n, what);
  }
  leave_in_place(p);
  return in_place;
}

bool ShmProcessGroup::reduce_scatter_in_place(OpContext& ctx, void* output, size_t count,
                                              DType dtype, ReduceOp op) {
  // This rank's block, reduced from every rank's input in rank order (the all-reduce's bits)
  // straight into the output.
  const bool done = run_in_place_part(ctx, "in-place reduce-scatter: peers still reading",
                                      [&](const std::vector<uint8_t*>& base) {
                                        const int n = size();
                                        const size_t es = dtype_size(dtype);
                                        std::vector<const void*> srcs(n);
                                        for (int q = 0; q < n; ++q)
                                          srcs[q] = base[q] + rank() * count * es;
                                        reduce_sources(output, srcs.data(), n, count, dtype, op, n);
                                      });
  if (done) in_place_reduce_scatters_.fetch_add(1, std::memory_order_relaxed);
  return done;
}

bool ShmProcessGroup::all_gather_in_place(OpContext& ctx, void* output, size_t count, DType dtype) {
  // Every rank's block is in its own output already: copy the peers' blocks from theirs.
  const bool done = run_in_place_part(
      ctx, "in-place all-gather: peers still reading", [&](const std::vector<uint8_t*>& base) {
        const size_t es = dtype_size(dtype);
        auto* out = static_cast<uint8_t*>(output);
        for (int q = 0; q < size(); ++q)
          if (q != rank()) std::memcpy(out + q * count * es, base[q] + q * count * es, count * es);
      });
  if (done) in_place_all_gathers_.fetch_add(1, std::memory_order_relaxed);
  return done;
}

}  // namespace meshtrain::comm
