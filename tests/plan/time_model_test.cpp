// The time model's element-wise, optimizer, pipeline and tensor-parallel terms against values
// computed by hand from the formulas in time_model.h, on a model small enough to count.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "meshtrain/plan/planner.h"
#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

// 4 blocks, C 64, 4 heads, V 100, T 32.
TrainSetup small_job(int64_t global_batch) {
  TrainSetup job;
  job.model = ModelShape{4, 64, 4, 100, 32, true, true};
  job.global_batch = global_batch;
  return job;
}

ClusterSpec flat_cluster(double elementwise_bandwidth) {
  ClusterSpec c;
  c.nodes = 1;
  c.devices_per_node = 8;
  c.device_memory = 80e9;
  c.peak_flops = 1e12;
  c.efficiency = 1.0;
  c.elementwise_bandwidth = elementwise_bandwidth;
  c.intra = {1e9, 1e-5};
  c.inter = {1e8, 1e-4};
  c.precision = "f32";
  return c;
}

TEST(TimeModelElementwise, PerTokenElementsByHand) {
  const ModelShape m{4, 64, 4, 100, 32, true, true};
  // Forward: 14C replicated + 22C + 3 NH T split = 896 + 1408 + 384.
  // Backward: 14C + 19C + 4 NH T = 896 + 1216 + 512. Head 5C + 5V, embedding 6C.
  const ElementwisePerToken e = elementwise_per_token(m, 32, 1, false);
  EXPECT_DOUBLE_EQ(e.block_forward, 2688);
  EXPECT_DOUBLE_EQ(e.block_backward, 2624);
  EXPECT_DOUBLE_EQ(e.head, 320 + 500);
  EXPECT_DOUBLE_EQ(e.embedding, 384);
  // tp 2 halves the column-parallel part and the vocabulary; sequence parallelism the rest too.
  const ElementwisePerToken t2 = elementwise_per_token(m, 32, 2, false);
  EXPECT_DOUBLE_EQ(t2.block_forward, 896 + (1408 + 384) / 2.0);
  EXPECT_DOUBLE_EQ(t2.block_backward, 896 + (1216 + 512) / 2.0);
  EXPECT_DOUBLE_EQ(t2.head, 320 + 250);
  const ElementwisePerToken sp = elementwise_per_token(m, 32, 2, true);
  EXPECT_DOUBLE_EQ(sp.block_forward, 2688 / 2.0);
  EXPECT_DOUBLE_EQ(sp.block_backward, 2624 / 2.0);
  EXPECT_DOUBLE_EQ(sp.embedding, 192);
  // Without biases: forward 10C + 8C + 3 NH T, backward 12C + 12C + 4 NH T.
  ModelShape nb = m;
  nb.bias = false;
  const ElementwisePerToken b = elementwise_per_token(nb, 32, 1, false);
  EXPECT_DOUBLE_EQ(b.block_forward, 18 * 64 + 384);
  EXPECT_DOUBLE_EQ(b.block_backward, 24 * 64 + 512);
}

TEST(TimeModelElementwise, OptimizerBytesPerParameter) {
  EXPECT_EQ(optimizer_bytes_per_param(Optimizer::kAdamW, Precision::kF32), 28);
  EXPECT_EQ(optimizer_bytes_per_param(Optimizer::kSgdMomentum, Precision::kF32), 20);
  EXPECT_EQ(optimizer_bytes_per_param(Optimizer::kSgd, Precision::kF32), 12);
  EXPECT_EQ(optimizer_bytes_per_param(Optimizer::kAdamW, Precision::kMixed), 30);
}

TEST(TimeModelElementwise, SingleRankStepAddsElementwiseAndOptimizerTime) {
  const TrainSetup job = small_job(4);
  const ClusterSpec without = flat_cluster(0), with = flat_cluster(1e9);
  Layout l;
  l.micro_batch = 4;
  const StepTime g = estimate_step_time(job, l, without);
  EXPECT_EQ(g.elementwise, 0);
  EXPECT_EQ(g.optimizer, 0);
  const StepTime s = estimate_step_time(job, l, with);
  EXPECT_DOUBLE_EQ(s.gemm, g.gemm);
  // 128 tokens x (4 blocks x (2688 + 2624) + 820 + 384) elements x 4 bytes at 1 GB/s.
  const double tokens = 4 * 32;
  EXPECT_NEAR(s.elementwise, tokens * (4 * (2688 + 2624) + 820 + 384) * 4 / 1e9, 1e-15);
  // AdamW over every parameter (28 bytes) and zeroing every gradient (4 bytes).
  const double P = static_cast<double>(model_params(job.model));
  EXPECT_NEAR(s.optimizer, P * 32 / 1e9, 1e-15);
  EXPECT_DOUBLE_EQ(s.compute, s.gemm + s.elementwise);
  EXPECT_DOUBLE_EQ(s.total, s.compute + s.optimizer);
  // Recomputing every block runs its forward's element-wise passes again.
  l.checkpoint_every = 1;
  const StepTime r = estimate_step_time(job, l, with);
  EXPECT_NEAR(r.elementwise - s.elementwise, tokens * 4 * 2688 * 4 / 1e9, 1e-15);
}

TEST(TimeModelElementwise, ZeroShardsTheOptimizerStep) {
  const TrainSetup job = small_job(16);
  const ClusterSpec c = flat_cluster(1e9);
  const double P = static_cast<double>(model_params(job.model));
  Layout l;
  l.dp = 4;
  l.micro_batch = 4;
  l.zero_stage = 0;
  EXPECT_NEAR(estimate_step_time(job, l, c).optimizer, (28 * P + 4 * P) / 1e9, 1e-15);
  l.zero_stage = 1;  // the update on a quarter, every gradient zeroed
  EXPECT_NEAR(estimate_step_time(job, l, c).optimizer, (28 * P / 4 + 4 * P) / 1e9, 1e-15);
  l.zero_stage = 2;  // gradients sharded too
  EXPECT_NEAR(estimate_step_time(job, l, c).optimizer, 32 * P / 4 / 1e9, 1e-15);
}

TEST(TimeModelPipeline, BubbleIsTheScheduleFraction) {
  const TrainSetup job = small_job(8);
  const ClusterSpec c = flat_cluster(1e9);
  Layout l;
  l.pp = 2;
  l.micro_batch = 1;
  l.micro_batches = 8;
  const StepTime s = estimate_step_time(job, l, c);
  // (P-1)/(M+P-1) of the pipelined time is idle: 1/9.
  EXPECT_NEAR(s.bubble / (s.compute + s.bubble), 1.0 / 9.0, 1e-12);
  // Element-wise work splits over the stages as the GEMMs do: half the single-stage figure.
  Layout one = l;
  one.pp = 1;
  EXPECT_NEAR(s.elementwise, estimate_step_time(job, one, c).elementwise / 2, 1e-15);
  // Pipeline p2p: per micro-batch one activation sent and one gradient back, B*T*C*4 bytes each,
  // over the intra link (2 ranks on one node).
  EXPECT_NEAR(s.pp_comm, 2 * 8 * (1 * 32 * 64 * 4 / 1e9 + 1e-5), 1e-15);
  // Interleaved with v = 2: (P-1)/(vM+P-1) = 1/17.
  l.schedule = ScheduleKind::interleaved;
  l.virtual_stages = 2;
  const StepTime v = estimate_step_time(job, l, c);
  EXPECT_NEAR(v.bubble / (v.compute + v.bubble), 1.0 / 17.0, 1e-12);
  EXPECT_NEAR(v.pp_comm, 2 * 2 * 8 * (32 * 64 * 4 / 1e9 + 1e-5), 1e-15);
  // The optimizer step is per stage: its parameters (the first stage's 2 blocks + embeddings).
  const MemoryBreakdown mem = estimate_memory(memory_input(job, l, Precision::kF32));
  EXPECT_NEAR(s.optimizer, 32.0 * static_cast<double>(mem.params_on_rank) / 1e9, 1e-15);
}

TEST(TimeModelTensorParallel, FourAllReducesPerBlockAndMicroBatch) {
  const TrainSetup job = small_job(8);
  const ClusterSpec c = flat_cluster(1e9);
  Layout l;
  l.tp = 2;
  l.micro_batch = 4;
  l.micro_batches = 2;
  const StepTime s = estimate_step_time(job, l, c);
  // 4 blocks x 2 micro-batches x 4 all-reduces of 4 x 32 x 64 f32 on 2 ranks.
  const double bytes = 4.0 * 32 * 64 * 4;
  EXPECT_NEAR(s.tp_comm, 32 * (2 * 0.5 * bytes / 1e9 + 2 * 1e-5), 1e-15);
  // Sequence parallelism swaps each all-reduce for an all-gather and a reduce-scatter: the same
  // ring volume and steps, so the same time; its element-wise work is split further.
  l.sequence_parallel = true;
  const StepTime sp = estimate_step_time(job, l, c);
  EXPECT_NEAR(sp.tp_comm, s.tp_comm, 1e-15);
  EXPECT_LT(sp.elementwise, s.elementwise);
  // Per rank, tp 2 moves the hand-counted elements of a TP rank.
  const ElementwisePerToken e = elementwise_per_token(job.model, 32, 2, false);
  EXPECT_NEAR(s.elementwise,
              8 * 32 * (4 * (e.block_forward + e.block_backward) + e.head + e.embedding) * 4 / 1e9,
              1e-15);
}

TEST(TimeModelElementwise, ClusterFileCarriesTheBandwidth) {
  ClusterSpec c = cluster_preset("cpu-host");
  EXPECT_GT(c.elementwise_bandwidth, 0);
  EXPECT_GT(cluster_preset("h100-nvlink-ib").elementwise_bandwidth, 1e12);
  c.elementwise_bandwidth = 7.25e9;
  const auto path = std::filesystem::temp_directory_path() /
                    ("mt_cluster_ew_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << cluster_to_toml(c);
  EXPECT_NEAR(load_cluster(path.string()).elementwise_bandwidth, 7.25e9, 1e3);
  std::ofstream(path) << "[cluster]\nelementwise_gbps = -2\n";
  try {
    load_cluster(path.string());
    ADD_FAILURE() << "a negative elementwise_gbps was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.elementwise_gbps must be a number >= 0"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace meshtrain::plan
