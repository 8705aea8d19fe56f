// Helpers for multi-rank tests: N threads in one process, each creating its own group member
// over one shared in-memory store, and deterministic per-rank inputs with exact references.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"

namespace meshtrain::comm::testing {

inline ProcessGroupOptions test_options(const std::string& backend) {
  ProcessGroupOptions o;
  o.name = "test";
  o.timeout = std::chrono::seconds(60);
  o.token = "test-token";
  o.address = "127.0.0.1";
  // hier: two simulated hosts (even and odd ranks) decided per rank by the caller.
  (void)backend;
  return o;
}

// Runs fn(group) on `world` threads, each with its own member of one group; rethrows the first
// failure after all threads finished.
inline void run_ranks(const std::string& backend, int world,
                      const std::function<void(ProcessGroup&)>& fn,
                      std::function<void(int, ProcessGroupOptions&)> tweak = nullptr) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::seconds(60));
  std::mutex mu;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        ProcessGroupOptions o = test_options(backend);
        if (backend == "hier") o.host_id = "host" + std::to_string(r % 2);
        if (tweak) tweak(r, o);
        auto pg = make_process_group(backend, store, r, world, o);
        fn(*pg);
      } catch (...) {
        std::lock_guard lock(mu);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Small exact values: sums, products (powers of two) and averages are exact in every dtype, so
// any reduction order gives the reference bits.
inline double input_value(int rank, size_t i, DType dtype, ReduceOp op) {
  if (op == ReduceOp::product) {
    static const double kVals[3] = {1.0, 2.0, -1.0};
    double v = kVals[(rank * 5 + i * 3) % 3];
    return dtype == DType::u8 ? std::fabs(v) : v;
  }
  int v = static_cast<int>((rank * 7 + i * 13) % 9);
  return dtype == DType::u8 ? v : v - 4;
}

inline void store_value(void* p, size_t i, DType dtype, double v) {
  switch (dtype) {
    case DType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DType::bf16:
      static_cast<uint16_t*>(p)[i] = f32_to_bf16(static_cast<float>(v));
      break;
    case DType::f16:
      static_cast<uint16_t*>(p)[i] = f32_to_f16(static_cast<float>(v));
      break;
    case DType::i32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DType::u8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

inline std::vector<uint8_t> make_input(int rank, size_t count, DType dtype, ReduceOp op,
                                       size_t offset = 0) {
  std::vector<uint8_t> buf(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    store_value(buf.data(), i, dtype, input_value(rank, i + offset, dtype, op));
  }
  return buf;
}

// The reduction of element i over ranks 0..world-1, computed independently of the library.
inline std::vector<uint8_t> reference_reduce(int world, size_t count, DType dtype, ReduceOp op,
                                             size_t offset = 0) {
  std::vector<uint8_t> out(count * dtype_size(dtype));
  for (size_t i = 0; i < count; ++i) {
    double acc = input_value(0, i + offset, dtype, op);
    int64_t iacc = static_cast<int64_t>(acc);
    for (int r = 1; r < world; ++r) {
      double v = input_value(r, i + offset, dtype, op);
      switch (op) {
        case ReduceOp::sum:
        case ReduceOp::avg:
          acc += v;
          break;
        case ReduceOp::product:
          acc *= v;
          break;
        case ReduceOp::min:
          acc = std::min(acc, v);
          break;
        case ReduceOp::max:
          acc = std::max(acc, v);
          break;
      }
      if (op == ReduceOp::product) iacc *= static_cast<int64_t>(v);
    }
    if (op != ReduceOp::product) iacc = static_cast<int64_t>(acc);
    if (dtype == DType::u8) iacc &= 0xff;  // u8 arithmetic wraps
    if (op == ReduceOp::avg) {
      if (is_floating(dtype)) {
        acc = static_cast<float>(acc) / static_cast<float>(world);
      } else {
        iacc /= world;
      }
    }
    store_value(out.data(), i, dtype, is_floating(dtype) ? acc : static_cast<double>(iacc));
  }
  return out;
}

// n bytes that differ from position to position and from seed to seed (payloads whose every
// byte a receiver can check).
inline std::vector<uint8_t> byte_pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 13);
  return v;
}

inline std::string hex_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size()) return "sizes differ";
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return "first difference at byte " + std::to_string(i);
  }
  return "equal";
}

}  // namespace meshtrain::comm::testing
