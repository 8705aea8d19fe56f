// Collective algorithms written against the Transport interface only, so that every transport
// gets all of them. Reductions here work on the accumulation type (callers widen bf16/f16 to
// f32 first and compute avg as a sum divided at the end) and combine values in an order fixed by
// the algorithm and the world size alone, so results are bitwise reproducible and identical on
// every rank:
//   ring              bandwidth-optimal; block b is reduced along the ring starting after rank b
//   halving_doubling  Rabenseifner: reduce-scatter by recursive halving, all-gather by doubling;
//                     ranks beyond the largest power of two fold into a partner first
//   tree              binomial reduce to a root, binomial broadcast back
//   direct            everyone sends everything to everyone; reduce in rank order 0..N-1
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshtrain/comm/reduce_op.h"
#include "meshtrain/comm/transport/transport.h"

namespace meshtrain::comm::algorithms {

// One collective's view of the transport: tags come from the operation's sequence number and a
// step counter, so messages of different operations and phases never match each other.
class Exchange {
 public:
  Exchange(Transport& transport, uint64_t seq, SteadyTime deadline)
      : t_(transport), seq_(seq), deadline_(deadline) {}
  int rank() const { return t_.rank(); }
  int size() const { return t_.size(); }
  // Advances the step; messages of one step match only messages of the same step.
  void next_step() { ++step_; }
  RequestPtr send(int peer, const void* data, size_t bytes) {
    return t_.post_send(peer, collective_tag(seq_, step_), data, bytes, deadline_);
  }
  RequestPtr recv(int peer, void* data, size_t bytes) {
    return t_.post_recv(peer, collective_tag(seq_, step_), data, bytes, deadline_);
  }
  // Sends to one peer while receiving from another, and waits for both.
  void send_recv(int to, const void* sdata, size_t sbytes, int from, void* rdata, size_t rbytes) {
    wait_all({send(to, sdata, sbytes), recv(from, rdata, rbytes)});
  }

 private:
  Transport& t_;
  const uint64_t seq_;
  const SteadyTime deadline_;
  uint32_t step_ = 0;
};

// In place, `count` elements of `dtype` (already the accumulation type), ReduceOp::avg treated as
// sum.
void all_reduce_ring(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op);
void all_reduce_halving_doubling(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op);
void all_reduce_tree(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op);
void all_reduce_direct(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op);

// Rooted: only the root's buffer holds the result.
void reduce_tree(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op, int root);
void broadcast_tree(Exchange& ex, void* data, size_t bytes, int root);
void broadcast_direct(Exchange& ex, void* data, size_t bytes, int root);

// in: size() * count elements; out: count elements, block rank() of the reduction.
void reduce_scatter_ring(Exchange& ex, const void* in, void* out, size_t count, DType dtype,
                         ReduceOp op);
void reduce_scatter_direct(Exchange& ex, const void* in, void* out, size_t count, DType dtype,
                           ReduceOp op);

// Block q has counts[q] elements of elem_bytes each, placed in rank order in out.
void all_gather_ring(Exchange& ex, const void* in, void* out, const std::vector<size_t>& counts,
                     size_t elem_bytes);
void all_gather_direct(Exchange& ex, const void* in, void* out, const std::vector<size_t>& counts,
                       size_t elem_bytes);
void gather_direct(Exchange& ex, const void* in, void* out, size_t bytes, int root);
void scatter_direct(Exchange& ex, const void* in, void* out, size_t bytes, int root);
void all_to_all_pairwise(Exchange& ex, const void* in, void* out, size_t bytes_per_peer);
// Block j of in (send_bytes[j] bytes) goes to rank j; block i of out (recv_bytes[i]) comes from
// rank i; blocks lie back to back in rank order. A block whose size differs from what its sender
// sends fails (the transport compares sizes).
void all_to_all_v_pairwise(Exchange& ex, const void* in, const std::vector<size_t>& send_bytes,
                           void* out, const std::vector<size_t>& recv_bytes);
void barrier_dissemination(Exchange& ex);

}  // namespace meshtrain::comm::algorithms
