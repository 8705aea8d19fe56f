// Helpers shared by the checkpoint tests: deterministic tensors, bitwise comparison, simulated
// ranks as threads meeting at a std::barrier, and small file manipulations (flip a byte,
// truncate) to model damage.
#pragma once

#include <barrier>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ckpt::testing {

// Values that are exact in f32: element i is (i % 17) * 0.25 - 2 + salt.
inline Tensor pattern(const Shape& shape, float salt = 0.0f) {
  Tensor t = Tensor::empty(shape, DType::f32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<float>(i % 17) * 0.25f - 2.0f + salt;
  return t;
}

// One rank's model weight and optimizer moment, distinguishable by step.
inline RankShards shards_for_step(int64_t step) {
  RankShards s;
  s.add_replicated("model", "w", pattern({8, 4}, static_cast<float>(step)));
  s.add_replicated("optim", "exp_avg.w", pattern({8, 4}, -static_cast<float>(step)));
  return s;
}

inline bool bitwise_equal(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

// Runs fn(rank) on `world` threads and joins them.
inline void run_ranks(int64_t world, const std::function<void(int64_t)>& fn) {
  std::vector<std::thread> threads;
  for (int64_t r = 0; r < world; ++r) threads.emplace_back([&fn, r] { fn(r); });
  for (auto& t : threads) t.join();
}

// A barrier usable as WriterOptions::barrier by `world` writer threads.
class ThreadBarrier {
 public:
  explicit ThreadBarrier(int64_t world) : barrier_(static_cast<std::ptrdiff_t>(world)) {}
  std::function<void(int64_t)> callback() {
    return [this](int64_t) { barrier_.arrive_and_wait(); };
  }

 private:
  std::barrier<> barrier_;
};

inline void flip_byte(const std::string& path, int64_t from_end = 1) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(f) << path;
  f.seekg(-from_end, std::ios::end);
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x01);
  f.seekp(-from_end, std::ios::end);
  f.write(&c, 1);
}

inline void truncate_by(const std::string& path, uint64_t nbytes) {
  const auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size - nbytes);
}

}  // namespace meshtrain::ckpt::testing
