// The resolved configuration: every string-valued key parsed once into its type, and every illegal
// combination refused by the one plan check as one line naming the keys.
#include "meshtrain/runtime/resolved_config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <type_traits>
#include <vector>

#include "meshtrain/parallel/pipeline/schedule.h"
#include "meshtrain/runtime/config.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

// The pipeline and the planner share one schedule enum.
static_assert(std::is_same_v<parallel::pipeline::ScheduleKind, plan::ScheduleKind>);

std::string refusal(const TrainConfig& c, std::optional<int> world = std::nullopt) {
  try {
    (void)resolve_config(c, world);
  } catch (const ValueError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ValueError";
  return "";
}

void expect_names(const std::string& line, const std::vector<std::string>& keys) {
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  for (const std::string& key : keys) EXPECT_NE(line.find(key), std::string::npos) << line;
}

TEST(ResolvedConfig, DefaultsResolveToTheirTypes) {
  const ResolvedConfig r = resolve_config(TrainConfig{});
  EXPECT_EQ(r.choice.optimizer, optim::OptimizerKind::adamw);
  EXPECT_EQ(r.precision, DType::f32);
  EXPECT_EQ(r.lr_decay, optim::LrDecay::cosine);
  EXPECT_EQ(r.log_format, obs::LogFormat::kText);
  EXPECT_TRUE(r.device.is_cpu());
  EXPECT_EQ(r.schedule, plan::ScheduleKind::one_f_one_b);
  EXPECT_EQ(r.partition, models::PartitionCost::flops);
  EXPECT_EQ(r.checkpointed_blocks, std::vector<bool>(4, false));
  EXPECT_FALSE(r.activation_checkpointing());
  EXPECT_TRUE(r.memory_check);
  EXPECT_FALSE(r.memory_limit.has_value());
  EXPECT_EQ(r.comm_hook.kind, parallel::CommHookKind::allreduce);
}

TEST(ResolvedConfig, StringKeysAreParsedOnce) {
  TrainConfig c;
  c.model.n_layer = 4;
  c.model.activation_checkpointing = "every:2";
  c.optim.name = "sgd";
  c.optim.schedule = "linear";
  c.train.precision = "bf16";
  c.train.log_format = "json";
  c.train.max_memory = "512MiB";
  c.dist.comm_hook = "powersgd:4:10";
  c.parallel.schedule = "gpipe";
  c.parallel.partition = "params";
  const ResolvedConfig r = resolve_config(c);
  EXPECT_EQ(r.checkpointed_blocks, (std::vector<bool>{true, false, true, false}));
  EXPECT_TRUE(r.activation_checkpointing());
  EXPECT_EQ(r.choice.optimizer, optim::OptimizerKind::sgd);
  EXPECT_EQ(r.lr_decay, optim::LrDecay::linear);
  EXPECT_EQ(r.precision, DType::bf16);
  EXPECT_EQ(r.log_format, obs::LogFormat::kJson);
  EXPECT_EQ(r.memory_limit, uint64_t{512} << 20);
  EXPECT_EQ(r.comm_hook.kind, parallel::CommHookKind::powersgd);
  EXPECT_EQ(r.comm_hook.powersgd_rank, 4);
  EXPECT_EQ(r.comm_hook.powersgd_warmup, 10);
  EXPECT_EQ(r.schedule, plan::ScheduleKind::gpipe);
  EXPECT_EQ(r.partition, models::PartitionCost::params);
  c.train.max_memory = "off";
  EXPECT_FALSE(resolve_config(c).memory_check);
}

TEST(ResolvedConfig, DeviceKeepsWhetherItFollowsTheLocalRank) {
  TrainConfig c;
  c.train.device = "cuda";
  ResolvedConfig r = resolve_config(c);
  EXPECT_EQ(r.device.type, DeviceType::cuda);
  EXPECT_TRUE(r.device_per_local_rank);
  c.train.device = "cuda:1";
  r = resolve_config(c);
  EXPECT_EQ(r.device.index, 1);
  EXPECT_FALSE(r.device_per_local_rank);
  c.train.device = "cuda:x";
  expect_names(refusal(c), {"train.device"});
}

// What the device once could not run (autocast, SGD, dropout, label smoothing) resolves with
// train.device = cuda, on machines without a GPU too.
TEST(PlanCheck, TheDeviceRunsWhatItOnceRefused) {
  TrainConfig c;
  c.train.device = "cuda";
  c.train.precision = "bf16";  // autocast runs on the device
  EXPECT_NO_THROW(resolve_config(c));
  c.train.precision = "f16";  // and so does its loss scaler
  EXPECT_NO_THROW(resolve_config(c));
  c.train.precision = "f32";
  c.optim.name = "sgd";  // has a device kernel
  EXPECT_NO_THROW(resolve_config(c));
  c.optim.name = "adamw";
  c.model.dropout = 0.1;  // has a device kernel, with the CPU's mask
  EXPECT_NO_THROW(resolve_config(c));
  c.model.dropout = 0.0;
  c.model.kind = "resnet";
  c.data.kind = "fashion_mnist";
  EXPECT_NO_THROW(resolve_config(c));  // the vision layers run on the device
  c.train.label_smoothing = 0.1;       // the device's cross-entropy smooths
  EXPECT_NO_THROW(resolve_config(c));
}

TEST(PlanCheck, EveryZeroStageRunsOnTheDevice) {
  TrainConfig c;
  c.train.device = "cuda";
  for (int stage : {1, 2, 3}) {
    c.parallel.zero_stage = stage;
    EXPECT_NO_THROW(resolve_config(c, 2)) << stage;
  }
}

// Tensor, sequence and pipeline parallelism run on the device, alone or together, with data
// parallelism or ZeRO-1/2 over the replicas; tensor parallelism in f32 only, as on the CPU.
TEST(PlanCheck, TheMeshRunsOnTheDevice) {
  TrainConfig c;
  c.train.device = "cuda";
  c.model.n_layer = 4;
  c.parallel.tp = 2;
  EXPECT_NO_THROW(resolve_config(c, 4));
  c.parallel.sequence_parallel = true;
  EXPECT_NO_THROW(resolve_config(c, 4));
  c.parallel.zero_stage = 1;
  EXPECT_NO_THROW(resolve_config(c, 4));
  c.parallel.pp = 2;
  EXPECT_NO_THROW(resolve_config(c, 8));
  c.parallel.tp = 1;
  c.parallel.sequence_parallel = false;
  c.parallel.zero_stage = 2;
  c.train.precision = "bf16";
  EXPECT_NO_THROW(resolve_config(c, 4));
  c.parallel.tp = 2;
  expect_names(refusal(c, 8), {"parallel.tp", "train.precision"});
}

// Gossip's replicas and a parameter server's workers train on the device (their exchanges go
// through host memory).
TEST(PlanCheck, GossipAndParameterServerWorkersRunOnTheDevice) {
  TrainConfig c;
  c.train.device = "cuda";
  c.parallel.mode = "gossip";
  EXPECT_NO_THROW(resolve_config(c, 4));
  c.parallel.mode = "parameter_server";
  EXPECT_NO_THROW(resolve_config(c, 4));
}

TEST(PlanCheck, RefusesAWorldThatTheLayoutDoesNotDivide) {
  TrainConfig c;
  c.model.n_layer = 4;
  c.parallel.pp = 2;
  EXPECT_NO_THROW(resolve_config(c));  // the world is not known yet
  EXPECT_NO_THROW(resolve_config(c, 4));
  expect_names(refusal(c, 3), {"parallel.pp x parallel.tp"});
}

TEST(PlanCheck, RefusesACompressingHookUnderShardedGradients) {
  TrainConfig c;
  c.parallel.zero_stage = 2;
  c.dist.comm_hook = "topk:0.1";
  expect_names(refusal(c), {"parallel.zero_stage", "dist.comm_hook"});
  c.parallel.zero_stage = 1;
  EXPECT_NO_THROW(resolve_config(c));
}

// model.kind = mlp: the hidden widths parse once; the classifier's data and what only the
// language model has are checked in the plan check, one line naming the keys.
TEST(ResolvedConfig, TheClassifiersWidthsAndCombinations) {
  EXPECT_EQ(parse_mlp_hidden("64,32,8"), (std::vector<int64_t>{64, 32, 8}));
  EXPECT_EQ(parse_mlp_hidden("5"), (std::vector<int64_t>{5}));
  for (const char* bad : {"", "64,", ",64", "64,0", "64,-3", "6x", "64;32"})
    EXPECT_THROW(parse_mlp_hidden(bad), ValueError) << bad;
  TrainConfig c;
  c.model.kind = "mlp";
  c.data.kind = "spirals";
  c.model.mlp_hidden = "16,8";
  const ResolvedConfig r = resolve_config(c, 2);
  EXPECT_EQ(r.choice.model, ModelKind::mlp);
  EXPECT_EQ(r.mlp_hidden, (std::vector<int64_t>{16, 8}));
  // A three-layer classifier cuts into at most three stages.
  c.parallel.pp = 4;
  c.data.batch_size = 4;
  expect_names(refusal(c), {"parallel.pp", "model.mlp_hidden"});
  c.parallel.pp = 1;
  c.data.kind = "tokens";
  expect_names(refusal(c), {"model.kind", "data.kind"});
  c.data.kind = "spirals";
  c.parallel.sequence_parallel = true;
  expect_names(refusal(c), {"model.kind", "parallel.sequence_parallel"});
  c.parallel.sequence_parallel = false;
  c.model.dropout = 0.1;
  expect_names(refusal(c), {"model.kind", "model.dropout"});
  TrainConfig gpt;
  gpt.data.kind = "spirals";
  expect_names(refusal(gpt), {"model.kind", "data.kind"});
}

}  // namespace
}  // namespace meshtrain::runtime

namespace meshtrain::runtime {
namespace {

TEST(ResolvedConfig, MixtureOfExpertsKeysResolveAndRefuseWhatCannotRunYet) {
  TrainConfig c;
  c.model.moe_every = 2;
  c.model.moe_num_experts = 4;
  c.model.moe_top_k = 2;
  c.model.moe_router_noise = "jitter";
  c.model.moe_drop_tokens = false;
  const ResolvedConfig r = resolve_config(c);
  EXPECT_TRUE(r.moe.enabled());
  EXPECT_TRUE(r.moe.is_moe_block(1));
  EXPECT_FALSE(r.moe.is_moe_block(2));
  EXPECT_EQ(r.moe.router_noise, nn::RouterNoise::jitter);
  EXPECT_EQ(r.moe.capacity(100, true), -1);  // dropless

  TrainConfig pp = c;
  pp.parallel.pp = 2;
  expect_names(refusal(pp), {"model.moe.every", "parallel.pp"});
  TrainConfig tp = c;
  tp.parallel.tp = 2;
  expect_names(refusal(tp), {"model.moe.every", "parallel.tp"});
  TrainConfig noise = c;
  noise.model.moe_router_noise = "gauss";
  expect_names(refusal(noise), {"model.moe.router_noise"});
  TrainConfig k = c;
  k.model.moe_top_k = 3;
  expect_names(refusal(k), {"model.moe.top_k"});
  TrainConfig every = c;
  every.model.moe_every = 5;  // more than the 4 blocks
  expect_names(refusal(every), {"model.moe.every", "model.n_layer"});
  // On a device the experts run there, shared out over ranks or not.
  TrainConfig cuda = c;
  cuda.train.device = "cuda";
  EXPECT_NO_THROW(resolve_config(cuda));
  cuda.parallel.ep = 2;
  EXPECT_NO_THROW(resolve_config(cuda, 2));
}

}  // namespace
}  // namespace meshtrain::runtime

namespace meshtrain::runtime {
namespace {

// Every config the repository ships loads and passes the plan check as it is.
TEST(ResolvedConfig, EveryShippedConfigResolves) {
  const std::filesystem::path dir = std::filesystem::path(MESHTRAIN_SOURCE_DIR) / "configs";
  int seen = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    EXPECT_NO_THROW((void)resolve_config(load_config(entry.path().string())));
    ++seen;
  }
  EXPECT_GE(seen, 3);
  const ResolvedConfig moe = resolve_config(load_config((dir / "demo_moe.toml").string()));
  EXPECT_TRUE(moe.moe.enabled());
  EXPECT_EQ(moe.moe.num_experts, 4);
  EXPECT_EQ(moe.moe.expert_hidden, 256);
}

}  // namespace
}  // namespace meshtrain::runtime
