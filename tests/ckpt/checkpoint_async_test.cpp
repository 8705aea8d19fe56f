// The deferred snapshot: save() returns before the state is copied, wait_snapshot() returns once
// it is, and the checkpoint holds exactly the state of the step it was taken at although the
// caller trains on (shown with a real GPT and AdamW, and with a copy held back by a test hook,
// not with timing). The snapshot budget still sends large saves down the synchronous path.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/train_state.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/temp_dir.h"
#include "tests/support/wait.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;
using testing::bitwise_equal;
using testing::pattern;
using testing::shards_for_step;

// Holds the writer's snapshot copy until opened.
class Gate {
 public:
  std::function<void()> hook() {
    return [this] {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return open_; });
    };
  }
  void open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

TEST(DeferredSnapshot, SaveReturnsBeforeTheCopyAndWaitSnapshotReturnsAfterIt) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  Gate gate;
  WriterOptions wo;
  wo.root = root;
  wo.deferred_snapshot = true;
  wo.before_snapshot = gate.hook();
  CheckpointWriter writer(wo);

  RankShards shards = shards_for_step(1);
  Tensor live = shards.groups()[0].second[0].data;
  const SaveStats st = writer.save(1, shards);
  // save() has returned although the copy cannot have started.
  EXPECT_TRUE(st.async);
  EXPECT_EQ(st.snapshot_s, 0.0);
  EXPECT_EQ(st.snapshot_bytes, shards.nbytes());
  EXPECT_TRUE(writer.in_flight());

  std::atomic<bool> copied{false};
  std::atomic<bool> gate_opened{false};
  std::atomic<bool> returned_before_the_gate_opened{false};
  std::atomic<pid_t> waiter_tid{0};
  std::thread waiter([&] {
    waiter_tid = meshtrain::testing::current_tid();
    writer.wait_snapshot();
    returned_before_the_gate_opened = !gate_opened.load();
    copied = true;
  });
  // wait_snapshot() has blocked (its thread sleeps in the kernel) or, wrongly, returned.
  EXPECT_TRUE(meshtrain::testing::wait_until(
      [&] {
        return copied.load() ||
               (waiter_tid.load() != 0 && meshtrain::testing::thread_is_asleep(waiter_tid));
      },
      std::chrono::seconds(30)));
  EXPECT_FALSE(copied.load()) << "wait_snapshot() returned while the copy was held";
  gate_opened = true;
  gate.open();
  waiter.join();
  EXPECT_FALSE(returned_before_the_gate_opened.load())
      << "wait_snapshot() returned while the copy was held";
  // Training may change its tensors now; the checkpoint holds the values at save().
  live.fill_(42.0);
  writer.wait();
  EXPECT_EQ(writer.wait_snapshot(), 0.0);  // nothing in flight: returns at once

  Checkpoint c = Checkpoint::open((fs::path(root) / "step_1").string());
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("w"), pattern({8, 4}, 1.0f)));
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("exp_avg.w"), pattern({8, 4}, -1.0f)));
}

TEST(DeferredSnapshot, TheWriterKeepsTheCallersTensorsAliveUntilTheCopy) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  Gate gate;
  WriterOptions wo;
  wo.root = root;
  wo.deferred_snapshot = true;
  wo.before_snapshot = gate.hook();
  CheckpointWriter writer(wo);
  writer.save(2, shards_for_step(2));  // the caller's only handles die here
  // Memory churn that would reuse freed tensor storage.
  std::vector<Tensor> churn;
  for (int i = 0; i < 64; ++i) churn.push_back(Tensor::full({8, 4}, 7.0));
  gate.open();
  writer.wait();
  Checkpoint c = Checkpoint::open((fs::path(root) / "step_2").string());
  EXPECT_TRUE(bitwise_equal(c.load_global_tensor("w"), pattern({8, 4}, 2.0f)));
}

TEST(DeferredSnapshot, OverBudgetSaveIsStillWrittenSynchronously) {
  TempDir dir;
  WriterOptions wo;
  wo.root = dir.file("ckpt");
  wo.deferred_snapshot = true;
  wo.max_snapshot_bytes = 16;
  CheckpointWriter writer(wo);
  RankShards shards = shards_for_step(3);
  const SaveStats st = writer.save(3, shards);
  EXPECT_FALSE(st.async);
  EXPECT_EQ(st.snapshot_bytes, 0u);
  EXPECT_FALSE(writer.in_flight());
  EXPECT_EQ(writer.wait_snapshot(), 0.0);
  EXPECT_TRUE(fs::exists(fs::path(wo.root) / "step_3" / kManifestFile));
  EXPECT_EQ(writer.last_saved_step(), 3);
}

// The trainer's order with a real model: save after an optimizer step, the next forward and
// backward while the writer copies, wait_snapshot(), then the updates go on. The copy is held
// back until after the forward and backward, so that an update that did not wait would land in
// the checkpoint; the checkpoint must hold the model and the AdamW state of the saved step.
TEST(DeferredSnapshot, CheckpointHoldsTheSavedStepOfAGptWhileTrainingGoesOn) {
  TempDir dir;
  const std::string root = dir.file("ckpt");
  nn::GPTConfig gc;
  gc.n_layer = 2;
  gc.n_embd = 32;
  gc.n_head = 2;
  gc.block_size = 16;
  nn::GPT model(gc);
  optim::AdamW optimizer(model.named_parameters(), optim::AdamWOptions{});
  std::vector<int32_t> xs(2 * 16), ys(2 * 16);
  for (size_t i = 0; i < xs.size(); ++i) {
    xs[i] = static_cast<int32_t>((i * 5 + 1) % 256);
    ys[i] = static_cast<int32_t>((i * 5 + 6) % 256);
  }
  const Tensor x = Tensor::from_vector(xs, {2, 16}), y = Tensor::from_vector(ys, {2, 16});
  auto forward_backward = [&] {
    optimizer.zero_grad();
    autograd::backward(model.loss(x, y));
  };
  forward_backward();
  optimizer.step();

  // The state of step 1, copied here for the comparison.
  std::map<std::string, Tensor> want;
  for (const auto& [name, t] : model.state_dict()) want[name] = t.clone();
  const optim::OptimizerState want_optim = optimizer.state_dict();

  bool copy_started = false;
  WriterOptions wo;
  wo.root = root;
  wo.deferred_snapshot = true;
  Gate gate;
  auto held = gate.hook();
  wo.before_snapshot = [&] {
    held();
    copy_started = true;
  };
  CheckpointWriter writer(wo);
  RankShards shards;
  shards.add_replicated("model", model.state_dict());
  nlohmann::json st = {{"step", 1}};
  st["optimizer"] = add_optimizer_state(shards, optimizer.state_view());
  writer.save(1, shards, st);

  forward_backward();  // reads the saved tensors while they wait for the copy
  gate.open();
  writer.wait_snapshot();
  EXPECT_TRUE(copy_started);
  for (int i = 0; i < 3; ++i) {
    optimizer.step();
    forward_backward();
  }
  writer.wait();

  Checkpoint c = Checkpoint::open((fs::path(root) / "step_1").string());
  int changed = 0;
  for (const auto& [name, live] : model.state_dict()) {
    EXPECT_TRUE(bitwise_equal(c.load_global_tensor(name), want.at(name))) << name;
    if (!bitwise_equal(live, want.at(name))) ++changed;
  }
  EXPECT_GT(changed, 0) << "training did not change the parameters after the save";
  const optim::OptimizerState got = load_optimizer_state(c, c.train_state().at("optimizer"));
  ASSERT_EQ(got.tensors.size(), want_optim.tensors.size());
  std::map<std::string, Tensor> got_tensors(got.tensors.begin(), got.tensors.end());
  for (const auto& [name, t] : want_optim.tensors)
    EXPECT_TRUE(bitwise_equal(got_tensors.at(name), t)) << name;
  EXPECT_EQ(got.scalars, want_optim.scalars);
}

}  // namespace
}  // namespace meshtrain::ckpt
