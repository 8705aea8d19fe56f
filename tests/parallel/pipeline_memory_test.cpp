// Activation memory on the first pipeline stage, measured with a counting allocator that sees
// only the first stage's thread: under GPipe it grows with the number of micro-batches (every
// forward's activations are kept until the backwards start), under 1F1B it stays at the P
// micro-batches in flight however many there are.
#include <gtest/gtest.h>

#include <iostream>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "meshtrain/models/gpt_stack.h"
#include "meshtrain/parallel/pipeline/stage_runner.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/storage.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel::pipeline {
namespace {

constexpr int64_t kB = 4, kT = 32;

// Counts the storage that one thread allocates, wherever it is freed.
class ThreadCountingAllocator final : public Allocator {
 public:
  explicit ThreadCountingAllocator(Allocator& base) : base_(base) {}
  void watch(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mu_);
    watched_ = id;
    peak_ = live_;
  }
  void* allocate(size_t nbytes, Device device) override {
    void* p = base_.allocate(nbytes, device);
    std::lock_guard<std::mutex> lock(mu_);
    if (std::this_thread::get_id() == watched_) {
      owned_[p] = nbytes;
      live_ += static_cast<int64_t>(nbytes);
      peak_ = std::max(peak_, live_);
    }
    return p;
  }
  void deallocate(void* p, size_t nbytes, Device device) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (auto it = owned_.find(p); it != owned_.end()) {
        live_ -= static_cast<int64_t>(it->second);
        owned_.erase(it);
      }
    }
    base_.deallocate(p, nbytes, device);
  }
  void copy(void* dst, Device dd, const void* src, Device sd, size_t nbytes) override {
    base_.copy(dst, dd, src, sd, nbytes);
  }
  void zero(void* p, size_t nbytes, Device device) override { base_.zero(p, nbytes, device); }
  int64_t live() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_;
  }
  int64_t peak() {
    std::lock_guard<std::mutex> lock(mu_);
    return peak_;
  }

 private:
  Allocator& base_;
  std::mutex mu_;
  std::thread::id watched_;
  std::unordered_map<void*, size_t> owned_;
  int64_t live_ = 0;
  int64_t peak_ = 0;
};

// Restores the allocator even when an assertion fails.
struct InstallAllocator {
  Allocator& previous;
  explicit InstallAllocator(Allocator& a) : previous(allocator_for(DeviceType::cpu)) {
    set_allocator(DeviceType::cpu, &a);
  }
  ~InstallAllocator() { set_allocator(DeviceType::cpu, &previous); }
};

// Peak bytes the first of two stages allocates during one step beyond what it held before.
int64_t first_stage_peak(ScheduleKind kind, int M) {
  nn::GPTConfig config;
  config.vocab_size = 37;
  config.block_size = kT;
  config.n_layer = 2;
  config.n_head = 2;
  config.n_embd = 32;
  std::vector<MicroBatch> mbs;
  for (int m = 0; m < M; ++m) {
    Generator gen(7 + static_cast<uint64_t>(m));
    Tensor x = Tensor::empty({kB, kT}, DType::i32);
    for (int64_t i = 0; i < kB * kT; ++i)
      x.data<int32_t>()[i] = static_cast<int32_t>(gen.next_u64() % 37);
    mbs.push_back({x, x});
  }
  ThreadCountingAllocator counting(allocator_for(DeviceType::cpu));
  InstallAllocator installed(counting);
  int64_t peak = 0;
  testing::run_shm_ranks(2, [&](int rank, const comm::ProcessGroupPtr& group) {
    const PipelineShape shape{2, M, 1, kind};
    models::GPTStack stack(config);
    const models::LayerRange r = stack.partition(2)[static_cast<size_t>(rank)];
    std::vector<std::shared_ptr<models::StageModule>> chunks{stack.build(r.begin, r.end)};
    StageRunner runner(shape, rank, chunks, group, kB, kT);
    // A first step allocates the parameters' gradients; the second is measured.
    runner.run(mbs);
    group->barrier()->wait();
    int64_t before = 0;
    if (rank == 0) {
      counting.watch(std::this_thread::get_id());
      before = counting.live();
    }
    runner.run(mbs);
    if (rank == 0) peak = counting.peak() - before;
  });
  return peak;
}

TEST(PipelineMemory, FirstStageActivationsGrowWithMUnderGPipeAndStayAtPUnder1F1B) {
  std::map<std::pair<int, int>, int64_t> peak;
  for (ScheduleKind kind : {ScheduleKind::gpipe, ScheduleKind::one_f_one_b})
    for (int M : {2, 4, 8}) {
      peak[{static_cast<int>(kind), M}] = first_stage_peak(kind, M);
      std::cout << schedule_kind_name(kind) << " M=" << M << ": first stage peak "
                << peak[{static_cast<int>(kind), M}] << " bytes\n";
    }
  const auto g = [&](int M) { return peak[{static_cast<int>(ScheduleKind::gpipe), M}]; };
  const auto f = [&](int M) { return peak[{static_cast<int>(ScheduleKind::one_f_one_b), M}]; };
  // GPipe: each further micro-batch adds its activations; 4 more add about twice what 2 did.
  const int64_t d1 = g(4) - g(2), d2 = g(8) - g(4);
  EXPECT_GT(d1, 0);
  EXPECT_GT(static_cast<double>(d2), 1.6 * static_cast<double>(d1));
  // 1F1B with P = 2: two micro-batches in flight whatever M is.
  EXPECT_EQ(f(4), f(2));
  EXPECT_EQ(f(8), f(2));
  EXPECT_EQ(f(2), g(2));  // with M = P both keep everything
  EXPECT_GT(static_cast<double>(g(8)), 3.0 * static_cast<double>(f(8)));
}

}  // namespace
}  // namespace meshtrain::parallel::pipeline
