// Direct algorithms: every message goes straight to its destination in one round. Best for tiny
// messages on small groups, and the natural shape of gather, scatter and all-to-all.
#include <cstring>
#include <vector>

#include "meshtrain/comm/algorithms/algorithms.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm::algorithms {

void all_reduce_direct(Exchange& ex, void* data, size_t count, DType dtype, ReduceOp op) {
  const int n = ex.size(), r = ex.rank();
  if (n == 1) return;
  const size_t bytes = count * dtype_size(dtype);
  std::vector<uint8_t> all(bytes * n);
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    reqs.push_back(ex.send(q, data, bytes));
    reqs.push_back(ex.recv(q, all.data() + q * bytes, bytes));
  }
  wait_all(reqs);
  std::vector<const void*> srcs(n);
  for (int q = 0; q < n; ++q) srcs[q] = q == r ? data : all.data() + q * bytes;
  reduce_sources(data, srcs.data(), n, count, dtype, op, 0);
}

void broadcast_direct(Exchange& ex, void* data, size_t bytes, int root) {
  if (ex.rank() != root) {
    ex.recv(root, data, bytes)->wait();
    return;
  }
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < ex.size(); ++q) {
    if (q != root) reqs.push_back(ex.send(q, data, bytes));
  }
  wait_all(reqs);
}

void reduce_scatter_direct(Exchange& ex, const void* in, void* out, size_t count, DType dtype,
                           ReduceOp op) {
  const int n = ex.size(), r = ex.rank();
  const size_t bytes = count * dtype_size(dtype);
  const auto* src = static_cast<const uint8_t*>(in);
  std::vector<uint8_t> all(bytes * n);
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    reqs.push_back(ex.send(q, src + q * bytes, bytes));
    reqs.push_back(ex.recv(q, all.data() + q * bytes, bytes));
  }
  wait_all(reqs);
  std::vector<const void*> srcs(n);
  for (int q = 0; q < n; ++q) srcs[q] = q == r ? src + r * bytes : all.data() + q * bytes;
  reduce_sources(out, srcs.data(), n, count, dtype, op, 0);
}

void all_gather_direct(Exchange& ex, const void* in, void* out, const std::vector<size_t>& counts,
                       size_t elem_bytes) {
  const int n = ex.size(), r = ex.rank();
  auto* dst = static_cast<uint8_t*>(out);
  std::vector<RequestPtr> reqs;
  size_t off = 0;
  for (int q = 0; q < n; ++q) {
    if (q == r) {
      if (counts[r] > 0) std::memcpy(dst + off, in, counts[r] * elem_bytes);
    } else {
      reqs.push_back(ex.send(q, in, counts[r] * elem_bytes));
      reqs.push_back(ex.recv(q, dst + off, counts[q] * elem_bytes));
    }
    off += counts[q] * elem_bytes;
  }
  wait_all(reqs);
}

void gather_direct(Exchange& ex, const void* in, void* out, size_t bytes, int root) {
  if (ex.rank() != root) {
    ex.send(root, in, bytes)->wait();
    return;
  }
  auto* dst = static_cast<uint8_t*>(out);
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < ex.size(); ++q) {
    if (q == root) {
      if (bytes > 0) std::memcpy(dst + q * bytes, in, bytes);
    } else {
      reqs.push_back(ex.recv(q, dst + q * bytes, bytes));
    }
  }
  wait_all(reqs);
}

void scatter_direct(Exchange& ex, const void* in, void* out, size_t bytes, int root) {
  if (ex.rank() != root) {
    ex.recv(root, out, bytes)->wait();
    return;
  }
  const auto* src = static_cast<const uint8_t*>(in);
  std::vector<RequestPtr> reqs;
  for (int q = 0; q < ex.size(); ++q) {
    if (q == root) {
      if (bytes > 0) std::memcpy(out, src + q * bytes, bytes);
    } else {
      reqs.push_back(ex.send(q, src + q * bytes, bytes));
    }
  }
  wait_all(reqs);
}

void all_to_all_pairwise(Exchange& ex, const void* in, void* out, size_t bytes_per_peer) {
  const int n = ex.size(), r = ex.rank();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  if (bytes_per_peer > 0)
    std::memcpy(dst + r * bytes_per_peer, src + r * bytes_per_peer, bytes_per_peer);
  std::vector<RequestPtr> reqs;
  for (int k = 1; k < n; ++k) {
    int to = (r + k) % n, from = (r - k + n) % n;
    reqs.push_back(ex.send(to, src + to * bytes_per_peer, bytes_per_peer));
    reqs.push_back(ex.recv(from, dst + from * bytes_per_peer, bytes_per_peer));
  }
  wait_all(reqs);
}

void all_to_all_v_pairwise(Exchange& ex, const void* in, const std::vector<size_t>& send_bytes,
                           void* out, const std::vector<size_t>& recv_bytes) {
  const int n = ex.size(), r = ex.rank();
  const auto* src = static_cast<const uint8_t*>(in);
  auto* dst = static_cast<uint8_t*>(out);
  std::vector<size_t> send_at(n, 0), recv_at(n, 0);
  for (int q = 1; q < n; ++q) {
    send_at[q] = send_at[q - 1] + send_bytes[q - 1];
    recv_at[q] = recv_at[q - 1] + recv_bytes[q - 1];
  }
  MT_CHECK(send_bytes[r] == recv_bytes[r], "all_to_all_v: rank ", r, " sends ", send_bytes[r],
           " bytes to itself but expects ", recv_bytes[r]);
  if (send_bytes[r] > 0) std::memcpy(dst + recv_at[r], src + send_at[r], send_bytes[r]);
  // Peers in the same order as all_to_all_pairwise: step k sends to r + k and receives from
  // r - k, so on a ring of links no peer is everyone's first. Empty blocks still travel: a
  // zero-byte message is what tells the receiver that its block is empty, and keeps every pair's
  // messages matched.
  std::vector<RequestPtr> reqs;
  reqs.reserve(2 * static_cast<size_t>(n));
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n, from = (r - k + n) % n;
    reqs.push_back(ex.send(to, src + send_at[to], send_bytes[to]));
    reqs.push_back(ex.recv(from, dst + recv_at[from], recv_bytes[from]));
  }
  wait_all(reqs);
}

void barrier_dissemination(Exchange& ex) {
  const int n = ex.size(), r = ex.rank();
  for (int k = 1; k < n; k *= 2) {
    ex.send_recv((r + k) % n, nullptr, 0, (r - k + n) % n, nullptr, 0);
    ex.next_step();
  }
}

}  // namespace meshtrain::comm::algorithms
