// Helpers for all_to_all_v tests: a matrix of counts every rank derives alike (counts[s][q]:
// elements that rank s sends to rank q), block contents that name their sender, receiver and
// position, and a bitwise check of a received buffer.
#pragma once

#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::comm::testing {

using CountMatrix = std::vector<std::vector<size_t>>;

// The shapes of exchange a test runs: uneven with zeros, everything to one rank, nothing at all,
// and blocks of megabytes (several staging steps, odd lengths).
enum class A2aShape { random, one_receiver, all_zero, large };

inline CountMatrix a2a_counts(A2aShape shape, int n, uint32_t seed, DType dtype) {
  CountMatrix c(n, std::vector<size_t>(n, 0));
  std::mt19937 gen(seed);
  for (int s = 0; s < n; ++s) {
    for (int q = 0; q < n; ++q) {
      switch (shape) {
        case A2aShape::random:
          // About a quarter of the blocks are empty.
          c[s][q] = gen() % 4 == 0 ? 0 : gen() % 3001;
          break;
        case A2aShape::one_receiver:
          c[s][q] = q == n - 1 ? 4099 + 17 * static_cast<size_t>(s) : 0;
          break;
        case A2aShape::all_zero:
          break;
        case A2aShape::large:
          // 1.5-3 MiB per block: a rank's blocks span several staging buffers.
          c[s][q] = ((size_t{3} << 19) + gen() % (size_t{3} << 19)) / dtype_size(dtype) | 1;
          break;
      }
    }
  }
  return c;
}

inline std::vector<size_t> a2a_send_counts(const CountMatrix& c, int rank) {
  return c[rank];
}

inline std::vector<size_t> a2a_recv_counts(const CountMatrix& c, int rank) {
  std::vector<size_t> r(c.size());
  for (size_t s = 0; s < c.size(); ++s) r[s] = c[s][rank];
  return r;
}

// Byte b of element k of the block from `src` to `dst`: a hash, so that a block landing at the
// wrong place, from the wrong sender or shifted by an element cannot match.
inline uint8_t a2a_byte(int src, int dst, size_t k, size_t b, uint32_t seed) {
  uint64_t x = (static_cast<uint64_t>(src) << 48) ^ (static_cast<uint64_t>(dst) << 32) ^
               (k * 0x9e3779b97f4a7c15ull) ^ (b << 56) ^ seed;
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return static_cast<uint8_t>(x);
}

inline std::vector<uint8_t> a2a_input(const CountMatrix& c, int rank, DType dtype, uint32_t seed) {
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> in;
  in.reserve(std::accumulate(c[rank].begin(), c[rank].end(), size_t{0}) * es);
  for (size_t q = 0; q < c.size(); ++q) {
    for (size_t k = 0; k < c[rank][q]; ++k) {
      for (size_t b = 0; b < es; ++b) in.push_back(a2a_byte(rank, static_cast<int>(q), k, b, seed));
    }
  }
  return in;
}

inline std::vector<uint8_t> a2a_expected(const CountMatrix& c, int rank, DType dtype,
                                         uint32_t seed) {
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> out;
  for (size_t s = 0; s < c.size(); ++s) out.reserve(out.capacity() + c[s][rank] * es);
  for (size_t s = 0; s < c.size(); ++s) {
    for (size_t k = 0; k < c[s][rank]; ++k) {
      for (size_t b = 0; b < es; ++b)
        out.push_back(a2a_byte(static_cast<int>(s), rank, k, b, seed));
    }
  }
  return out;
}

// Runs one all_to_all_v of the matrix on `pg` (receive counts from exchange_counts when
// `exchange` is set) and returns "" when every received byte is right, else what went wrong.
inline std::string a2a_run_and_check(ProcessGroup& pg, const CountMatrix& c, DType dtype,
                                     uint32_t seed, bool exchange) {
  const int r = pg.rank();
  const auto send = a2a_send_counts(c, r);
  auto recv = a2a_recv_counts(c, r);
  if (exchange) {
    const auto got = pg.exchange_counts(send);
    if (got != recv) return "exchange_counts returned other counts";
    recv = got;
  }
  const auto in = a2a_input(c, r, dtype, seed);
  const auto want = a2a_expected(c, r, dtype, seed);
  // One element of slack on each side, filled with a marker, to catch writes past the blocks.
  const size_t es = dtype_size(dtype);
  std::vector<uint8_t> out(want.size() + 2 * es, 0xa5);
  pg.all_to_all_v(in.data(), send, out.data() + es, recv, dtype)->wait();
  for (size_t b = 0; b < es; ++b) {
    if (out[b] != 0xa5 || out[out.size() - 1 - b] != 0xa5) return "wrote outside the output";
  }
  if (std::memcmp(out.data() + es, want.data(), want.size()) != 0) {
    size_t i = 0;
    while (out[es + i] == want[i]) ++i;
    size_t at = 0, s = 0;
    while (s < c.size() && at + c[s][r] * es <= i) {
      at += c[s][r] * es;
      ++s;
    }
    return "rank " + std::to_string(r) + ": byte " + std::to_string(i) +
           " of the output (block from rank " + std::to_string(s) + ", element " +
           std::to_string((i - at) / es) + ") differs";
  }
  return "";
}

}  // namespace meshtrain::comm::testing
