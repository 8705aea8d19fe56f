// PrefetchingLoader: the same batches as the plain loader, a position that counts consumed (not
// prepared) batches, prompt shutdown with a full queue, and worker failures delivered in order.
#include "meshtrain/data/prefetch_loader.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "meshtrain/data/token_shard.h"
#include "meshtrain/util/error.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

using meshtrain::testing::TempDir;

constexpr int64_t kContext = 8, kBatch = 3;

std::shared_ptr<const TokenDataset> make_dataset(const TempDir& dir) {
  std::vector<int32_t> tokens(2000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 7 + 3) % 251);
  write_token_shard(dir.file("train_000000.bin"), tokens);
  return std::make_shared<const TokenDataset>(
      TokenDataset::from_dir(dir.path().string(), "train", kContext));
}

SamplerOptions shuffled(int64_t replicas = 1, int64_t rank = 0) {
  SamplerOptions o;
  o.seed = 11;
  o.shuffle = true;
  o.num_replicas = replicas;
  o.rank = rank;
  return o;
}

void expect_same_batch(const std::pair<Tensor, Tensor>& a, const std::pair<Tensor, Tensor>& b,
                       int64_t i) {
  ASSERT_EQ(a.first.shape(), b.first.shape()) << "batch " << i;
  EXPECT_EQ(a.first.to_vector(), b.first.to_vector()) << "inputs of batch " << i;
  EXPECT_EQ(a.second.to_vector(), b.second.to_vector()) << "targets of batch " << i;
}

TEST(PrefetchingLoader, SameSequenceAsThePlainLoader) {
  TempDir dir;
  auto ds = make_dataset(dir);
  for (int64_t depth : {1, 2, 4}) {
    for (int64_t rank : {0, 1}) {
      DataLoader plain(ds, shuffled(2, rank), kBatch);
      PrefetchingLoader pre(DataLoader(ds, shuffled(2, rank), kBatch), {.depth = depth});
      // More than an epoch, so the epoch boundary is crossed.
      const int64_t n = 2 * plain.sampler().samples_per_epoch() / kBatch + 3;
      for (int64_t i = 0; i < n; ++i) expect_same_batch(pre.next(), plain.next(), i);
      EXPECT_EQ(pre.state(), plain.state());
    }
  }
}

TEST(PrefetchingLoader, StateCountsConsumedBatchesNotPreparedOnes) {
  TempDir dir;
  auto ds = make_dataset(dir);
  DataLoader plain(ds, shuffled(), kBatch);
  PrefetchingLoader pre(DataLoader(ds, shuffled(), kBatch), {.depth = 4});
  EXPECT_EQ(pre.state(), plain.state());
  for (int i = 0; i < 5; ++i) {
    pre.next();
    plain.next();
  }
  // Let the worker fill its queue: the position must still be 5 batches in.
  for (int i = 0; i < 200 && pre.ready() < pre.depth(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(pre.ready(), pre.depth());
  const SamplerState saved = pre.state();
  EXPECT_EQ(saved, plain.state());

  // A new loader restored from the saved position continues the exact sequence.
  PrefetchingLoader resumed(DataLoader(ds, shuffled(), kBatch), {.depth = 3});
  resumed.set_state(saved);
  EXPECT_EQ(resumed.state(), saved);
  DataLoader reference(ds, shuffled(), kBatch);
  reference.set_state(saved);
  for (int64_t i = 0; i < 10; ++i) expect_same_batch(resumed.next(), reference.next(), i);

  // Restoring in place drops the prepared batches and rewinds.
  pre.set_state(saved);
  DataLoader again(ds, shuffled(), kBatch);
  again.set_state(saved);
  for (int64_t i = 0; i < 10; ++i) expect_same_batch(pre.next(), again.next(), i);
}

TEST(PrefetchingLoader, RejectedStateLeavesTheLoaderWhereItWas) {
  TempDir dir;
  auto ds = make_dataset(dir);
  PrefetchingLoader pre(DataLoader(ds, shuffled(), kBatch), {.depth = 2});
  DataLoader plain(ds, shuffled(), kBatch);
  for (int i = 0; i < 3; ++i) {
    pre.next();
    plain.next();
  }
  const SamplerState before = pre.state();
  EXPECT_THROW(pre.set_state({.epoch = -1, .offset = 0}), ValueError);
  EXPECT_EQ(pre.state(), before);
  for (int64_t i = 0; i < 4; ++i) expect_same_batch(pre.next(), plain.next(), i);
}

TEST(PrefetchingLoader, BadDepthIsAnError) {
  TempDir dir;
  auto ds = make_dataset(dir);
  EXPECT_THROW(PrefetchingLoader(DataLoader(ds, shuffled(), kBatch), {.depth = 0}), ValueError);
  EXPECT_THROW(PrefetchingLoader(DataLoader(ds, shuffled(), kBatch), {.depth = 65}), ValueError);
}

// A source of numbered batches that can fail at a given batch and counts what it produced.
class CountingSource : public BatchSource {
 public:
  CountingSource(int64_t fail_at, std::atomic<int64_t>* produced)
      : fail_at_(fail_at), produced_(produced) {}
  std::pair<Tensor, Tensor> next() override {
    if (pos_ == fail_at_) MT_THROW(IoError, "shard read failed at batch ", pos_);
    Tensor x = Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(pos_)}, {1, 1});
    ++pos_;
    ++*produced_;
    return {x, x};
  }
  SamplerState state() const override { return {.epoch = 0, .offset = pos_}; }
  void set_state(const SamplerState& s) override { pos_ = s.offset; }

 private:
  int64_t fail_at_;
  int64_t pos_ = 0;
  std::atomic<int64_t>* produced_;
};

TEST(PrefetchingLoader, ShutdownWithAFullQueueJoinsPromptly) {
  std::atomic<int64_t> produced{0};
  {
    PrefetchingLoader pre(std::make_unique<CountingSource>(-1, &produced), {.depth = 3});
    EXPECT_EQ(pre.next().first.to_vector()[0], 0.0f);
    for (int i = 0; i < 400 && pre.ready() < 3; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    // The worker is now blocked on the full queue; the destructor must wake and join it.
  }
  // Bounded: one consumed batch plus at most `depth` prepared ones.
  EXPECT_LE(produced.load(), 4);
  EXPECT_GE(produced.load(), 1);
  // Destroyed before anything was consumed.
  { PrefetchingLoader idle(std::make_unique<CountingSource>(-1, &produced), {.depth = 2}); }
}

TEST(PrefetchingLoader, WorkerFailureSurfacesInOrderOnNext) {
  std::atomic<int64_t> produced{0};
  PrefetchingLoader pre(std::make_unique<CountingSource>(3, &produced), {.depth = 2});
  for (int i = 0; i < 3; ++i) EXPECT_EQ(pre.next().first.to_vector()[0], static_cast<float>(i));
  EXPECT_THROW(pre.next(), IoError);
  EXPECT_THROW(pre.next(), IoError);  // stays failed
  EXPECT_EQ(pre.state().offset, 3);   // the failed batch was never consumed
  // Moving the source past the bad batch recovers.
  pre.set_state({.epoch = 0, .offset = 4});
  EXPECT_EQ(pre.next().first.to_vector()[0], 4.0f);
}

}  // namespace
}  // namespace meshtrain::data
