// The silent-divergence guard: data-parallel replicas must stay bitwise identical, and the trainer
// compares parameter checksums every dist.check_interval steps. A replica nudged after the
// start-up broadcast (standing in for a bug or bad memory) must stop training on every rank with
// an error that names the ranks and the tensor; untouched replicas must train through, with every
// comm hook.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/data/token_shard.h"
#include "meshtrain/runtime/trainer.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::runtime {
namespace {

using meshtrain::testing::TempDir;

TrainConfig tiny_config(const TempDir& dir) {
  std::vector<int32_t> tokens(3000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 13 + 5) % 97);
  data::write_token_shard(dir.file("train_000000.bin"), tokens);
  data::write_token_shard(dir.file("val_000000.bin"), tokens);
  TrainConfig c;
  c.model.n_layer = 1;
  c.model.n_head = 2;
  c.model.n_embd = 16;
  c.model.block_size = 16;
  c.model.vocab_size = 97;
  c.data.dir = dir.path().string();
  c.data.batch_size = 2;
  c.data.val_batches = 1;
  c.train.steps = 4;
  c.train.eval_interval = 0;
  c.train.threads = 1;
  c.train.out_dir = (dir.path() / "run").string();
  c.train.save_weights = false;
  c.train.sample_tokens = 0;
  c.optim.warmup_steps = 1;
  c.dist.check_interval = 2;
  c.dist.backend = "shm";
  return c;
}

// Trains on two ranks (threads); rank 1 adds `nudge` to the first element of parameter
// `nudged` (by registration index) after construction, i.e. after rank 0's broadcast.
// Returns each rank's failure message, empty when it trained through.
std::vector<std::string> train_two_ranks(const TrainConfig& c, size_t nudged, float nudge,
                                         std::string* nudged_name) {
  comm::register_builtin_backends();
  auto store = std::make_shared<comm::HashStore>();
  static std::atomic<int> group_id{0};
  const std::string name = "guard" + std::to_string(group_id++);
  std::vector<std::string> errors(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      try {
        comm::ProcessGroupOptions po;
        po.name = name;
        po.timeout = std::chrono::seconds(60);
        TrainerOptions o;
        o.group = comm::make_process_group("shm", store, r, 2, po);
        o.store = store;
        o.ranks_on_host = 2;
        Trainer trainer(c, o);
        if (r == 1 && nudge != 0) {
          auto params = trainer.model().named_parameters();
          ASSERT_LT(nudged, params.size());
          *nudged_name = params[nudged].first;
          params[nudged].second.data<float>()[0] += nudge;
        }
        trainer.run();
      } catch (const Error& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

TEST(DivergenceGuard, IdenticalReplicasTrainThrough) {
  TempDir dir;
  TrainConfig c = tiny_config(dir);
  auto errors = train_two_ranks(c, 0, 0.0f, nullptr);
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

// Compressing hooks apply bitwise the same update on every rank, so the guard stays quiet with
// them too (and the config accepts their names with parameters).
TEST(DivergenceGuard, CompressedHooksKeepReplicasInSync) {
  for (const char* hook : {"topk:0.05", "powersgd:2", "powersgd:1:2"}) {
    TempDir dir;
    TrainConfig c = tiny_config(dir);
    c.dist.comm_hook = hook;
    c.dist.check_interval = 1;
    auto errors = train_two_ranks(c, 0, 0.0f, nullptr);
    EXPECT_EQ(errors[0], "") << hook;
    EXPECT_EQ(errors[1], "") << hook;
  }
}

TEST(DivergenceGuard, ANudgedReplicaStopsEveryRankNamingTheTensor) {
  TempDir dir;
  TrainConfig c = tiny_config(dir);
  std::string name;
  auto errors = train_two_ranks(c, 3, 1e-3f, &name);
  ASSERT_FALSE(name.empty());
  for (int r = 0; r < 2; ++r) {
    const std::string& e = errors[static_cast<size_t>(r)];
    EXPECT_NE(e.find("diverged between rank 0 and rank 1"), std::string::npos) << e;
    EXPECT_NE(e.find("'" + name + "'"), std::string::npos) << e;
    EXPECT_NE(e.find("step 2"), std::string::npos) << e;  // the first check
  }
}

}  // namespace
}  // namespace meshtrain::runtime
