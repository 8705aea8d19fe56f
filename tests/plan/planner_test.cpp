// The step-time model against hand-computed values, and the planner's enumeration, ranking and
// pruning reasons.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "meshtrain/plan/planner.h"
#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

ClusterSpec toy_cluster(int64_t nodes, int64_t per_node) {
  ClusterSpec c;
  c.nodes = nodes;
  c.devices_per_node = per_node;
  c.device_memory = 80e9;
  c.peak_flops = 100e12;
  c.efficiency = 0.5;
  c.intra = {100e9, 1e-5};
  c.inter = {10e9, 1e-4};
  c.precision = "f32";
  return c;
}

TrainSetup gpt2_job(int64_t global_batch) {
  TrainSetup job;
  job.model_name = "gpt2-124m";
  job.model = model_preset("gpt2-124m");
  job.global_batch = global_batch;
  return job;
}

TEST(TimeModel, RingFormulas) {
  const Link link{1e9, 1e-5};
  EXPECT_DOUBLE_EQ(all_reduce_time(1e9, 4, link), 2 * 0.75 + 6 * 1e-5);
  EXPECT_DOUBLE_EQ(reduce_scatter_time(1e9, 4, link), 0.75 + 3 * 1e-5);
  EXPECT_EQ(all_reduce_time(1e9, 1, link), 0);
}

TEST(TimeModel, ThinGemmsRunSlower) {
  ClusterSpec c = toy_cluster(1, 1);
  EXPECT_EQ(gemm_shape_factor(64, 64, 64, c), 1.0) << "no half dimension: shape-blind";
  c.gemm_half_dim = 128;
  EXPECT_DOUBLE_EQ(gemm_shape_factor(128, 1e12, 1e12, c),
                   0.5 * (1e12 / (1e12 + 128)) * (1e12 / (1e12 + 128)));
  EXPECT_DOUBLE_EQ(gemm_shape_factor(128, 256, 384, c), 0.5 * (2.0 / 3) * 0.75);
  // The same tokens in micro-batches of 1 sequence cost more compute than in micro-batches of 8;
  // the FLOPs are the same.
  const TrainSetup job = gpt2_job(8);
  Layout one, eight;
  one.micro_batch = 1;
  one.micro_batches = 8;
  eight.micro_batch = 8;
  const StepTime t1 = estimate_step_time(job, one, c), t8 = estimate_step_time(job, eight, c);
  EXPECT_DOUBLE_EQ(t1.hardware_flops, t8.hardware_flops);
  EXPECT_GT(t1.compute, t8.compute);
  // Each GEMM still takes at least its FLOPs at the large-product rate.
  EXPECT_GT(t8.compute, t8.hardware_flops / (c.peak_flops * c.efficiency));
}

TEST(Planner, ThinMicroBatchesNoLongerWinDeepPipelines) {
  // GPT-2 1.5B on 2 nodes of 8 H100 with 40 GB each (with 80, plain data parallelism of 16
  // sequences a rank fits and wins): shape-blind, a pipeline of micro-batches of 1 sequence
  // looks best (the smallest bubble at no cost); with GEMM rates that fall for thin products the
  // best layout uses larger micro-batches.
  TrainSetup job;
  job.model_name = "gpt2-1.5b";
  job.model = model_preset("gpt2-1.5b");
  job.global_batch = 256;
  ClusterSpec c = cluster_preset("h100-nvlink-ib");
  c.nodes = 2;
  c.device_memory = 40e9;
  ASSERT_GT(c.gemm_half_dim, 0);
  const Plan shaped = make_plan(job, c);
  c.gemm_half_dim = 0;
  const Plan blind = make_plan(job, c);
  EXPECT_EQ(blind.kept.front().layout.micro_batch, 1) << blind.kept.front().layout.str();
  EXPECT_GT(shaped.kept.front().layout.micro_batch, 1) << shaped.kept.front().layout.str();
}

TEST(TimeModel, SingleRankIsComputeOnly) {
  const TrainSetup job = gpt2_job(8);
  const ClusterSpec c = toy_cluster(1, 1);
  Layout l;
  l.micro_batch = 8;
  const StepTime t = estimate_step_time(job, l, c);
  const double C = 768, L = 12, V = 50257, T = 1024;
  const double per_token = 6 * (L * 12 * C * C + V * C) + 6 * L * T * C;
  EXPECT_DOUBLE_EQ(flops_per_token(job.model, 1024), per_token);
  EXPECT_NEAR(t.compute, 8 * T * per_token / 50e12, 1e-12);
  EXPECT_EQ(t.bubble + t.tp_comm + t.pp_comm + t.dp_comm, 0);
  EXPECT_DOUBLE_EQ(t.total, t.compute);
  // Recomputing every block adds its forward: a third of the blocks' FLOPs.
  l.checkpoint_every = 1;
  const StepTime r = estimate_step_time(job, l, c);
  const double block = 6 * (12 * C * C + T * C);
  EXPECT_NEAR(r.hardware_flops - t.hardware_flops, 8 * T * L * block / 3, 1e3);
  EXPECT_DOUBLE_EQ(r.model_flops, t.model_flops);
}

TEST(TimeModel, BubbleTpAndDp) {
  const TrainSetup job = gpt2_job(64);
  const ClusterSpec c = toy_cluster(2, 4);
  Layout pipe;
  pipe.pp = 4;
  pipe.micro_batches = 8;
  pipe.micro_batch = 8;
  const StepTime p = estimate_step_time(job, pipe, c);
  EXPECT_NEAR(p.bubble, p.compute * 3.0 / 8.0, 1e-12);
  EXPECT_FALSE(p.pp_cross_node);

  Layout tp;
  tp.tp = 4;
  tp.micro_batch = 64;
  const StepTime t = estimate_step_time(job, tp, c);
  // 12 blocks x 4 all-reduces of B*T*C f32 on 4 ranks over NVLink-like intra links.
  const double bytes = 64.0 * 1024 * 768 * 4;
  EXPECT_NEAR(t.tp_comm, 48 * (1.5 * bytes / 100e9 + 6 * 1e-5), 1e-9);
  EXPECT_FALSE(t.tp_cross_node);
  EXPECT_TRUE(estimate_step_time(job, tp, toy_cluster(4, 2)).tp_cross_node);

  Layout dp;
  dp.dp = 8;  // crosses nodes: inter link
  dp.micro_batch = 8;
  const StepTime d = estimate_step_time(job, dp, c);
  EXPECT_TRUE(d.dp_cross_node);
  const double grads = 4.0 * 124439808;
  const double buckets = std::ceil(grads / (25 << 20));
  EXPECT_NEAR(d.dp_comm, 2 * 7.0 / 8 * grads / 10e9 + 2 * 7 * 1e-4 * buckets, 1e-9);
  EXPECT_GE(d.dp_exposed, d.dp_comm / buckets - 1e-12);
  EXPECT_LE(d.dp_exposed, d.dp_comm);
}

TEST(Planner, KeepsOnlyWhatFitsBestFirst) {
  const TrainSetup job = gpt2_job(64);
  const ClusterSpec c = toy_cluster(1, 8);
  const Plan plan = make_plan(job, c);
  ASSERT_FALSE(plan.kept.empty());
  for (size_t i = 0; i < plan.kept.size(); ++i) {
    EXPECT_LE(static_cast<double>(plan.kept[i].memory.total()), 0.9 * c.device_memory);
    EXPECT_EQ(plan.kept[i].layout.world(), 8);
    EXPECT_EQ(plan.kept[i].layout.dp * plan.kept[i].layout.micro_batch *
                  plan.kept[i].layout.micro_batches,
              64);
    if (i > 0) {
      EXPECT_LE(plan.kept[i - 1].time.total, plan.kept[i].time.total);
    }
  }
  const std::string table = plan_table(plan, job, c, 5);
  EXPECT_NE(table.find("layouts fit"), std::string::npos) << table;
}

TEST(Planner, DropsWithReasons) {
  // 4 nodes of 2: tp 4 crosses nodes; pp 4 with 2 micro-batches cannot fill the pipeline.
  TrainSetup job = gpt2_job(16);
  const Plan plan = make_plan(job, toy_cluster(4, 2));
  EXPECT_GT(plan.dropped_by_reason.at("cross-node TP"), 0);
  EXPECT_GT(plan.dropped_by_reason.at("bubble"), 0);
  for (const Candidate& c : plan.kept) EXPECT_LE(c.layout.tp, 2);
  const std::string table = plan_table(plan, job, toy_cluster(4, 2), 3);
  EXPECT_NE(table.find("cross-node TP (e.g."), std::string::npos) << table;

  // A 70B model on 8 devices of 24 GB without ZeRO-3 sharding enough: most layouts do not fit.
  TrainSetup big;
  big.model_name = "dense-70b";
  big.model = model_preset("dense-70b");
  big.global_batch = 8;
  ClusterSpec small = toy_cluster(1, 8);
  small.device_memory = 24e9;
  try {
    make_plan(big, small);
    FAIL() << "a 70B model fitted 8 x 24 GB";
  } catch (const ValueError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no layout of dense-70b fits 8 devices"), std::string::npos) << what;
    EXPECT_NE(what.find("per device"), std::string::npos) << what;
  }
}

TEST(Planner, ZeroThreeMakesABigModelFit) {
  TrainSetup job;
  job.model_name = "gpt2-1.5b";
  job.model = model_preset("gpt2-1.5b");
  job.global_batch = 32;
  ClusterSpec c = toy_cluster(1, 8);
  c.device_memory = 20e9;  // 16 bytes x 1.56e9 = 25 GB of state: only sharding fits
  PlanOptions o;
  o.fixed_tp = 1;
  o.fixed_pp = 1;
  const Plan plan = make_plan(job, c, o);
  for (const Candidate& k : plan.kept) EXPECT_GE(k.layout.zero_stage, 1) << k.layout.str();
  EXPECT_GT(plan.dropped_by_reason.at("does not fit"), 0);
}

TEST(Planner, ParallelSectionUsesTheTrainerKeys) {
  Layout l;
  l.pp = 2;
  l.tp = 4;
  l.zero_stage = 1;
  l.micro_batches = 8;
  l.schedule = ScheduleKind::interleaved;
  l.virtual_stages = 2;
  l.sequence_parallel = true;
  EXPECT_EQ(parallel_toml(l),
            "[parallel]\nzero_stage = 1\npp = 2\ntp = 4\nschedule = \"interleaved\"\n"
            "micro_batches = 8\nvirtual_stages = 2\nsequence_parallel = true\n");
}

TEST(Planner, CountsEachRanksProcessMemory) {
  // What a rank's process holds besides its tensors is part of every layout's total, and can
  // make a layout that fits without it not fit.
  ClusterSpec c = toy_cluster(1, 4);
  const Plan without = make_plan(gpt2_job(32), c);
  int64_t largest = 0;
  for (const Candidate& k : without.kept) largest = std::max(largest, k.memory.total());
  // Just enough to push the largest layout over the 90% of device memory a plan may use.
  const int64_t process = static_cast<int64_t>(0.9 * c.device_memory) - largest + (1 << 20);
  ASSERT_GT(process, 0);
  c.process_memory = static_cast<double>(process);
  const Plan with = make_plan(gpt2_job(32), c);
  ASSERT_FALSE(with.kept.empty());
  for (const Candidate& k : with.kept) {
    EXPECT_EQ(k.memory.process, process);
    EXPECT_EQ(k.memory.total(), k.memory.parameters + k.memory.gradients +
                                    k.memory.optimizer_state + k.memory.activations +
                                    k.memory.buffers + k.memory.process);
  }
  EXPECT_LT(with.kept.size(), without.kept.size()) << "the largest layout must no longer fit";
  // estimate_memory alone (what the engine's memory guard calls) leaves it out: the running
  // process already holds it.
  EXPECT_EQ(estimate_memory(memory_input(gpt2_job(32), with.kept.front().layout, Precision::kF32))
                .process,
            0);
}

TEST(Planner, ClusterFileCarriesProcessMemory) {
  ClusterSpec c = cluster_preset("cpu-host");
  EXPECT_GT(c.process_memory, 0) << "the CPU preset states what a rank's process holds";
  c.process_memory = 123.5 * 1048576.0;
  c.gemm_half_dim = 37.5;
  const auto path = std::filesystem::temp_directory_path() /
                    ("mt_cluster_" + std::to_string(::getpid()) + ".toml");
  std::ofstream(path) << cluster_to_toml(c);
  EXPECT_NEAR(load_cluster(path.string()).process_memory, c.process_memory, 1.0);
  EXPECT_DOUBLE_EQ(load_cluster(path.string()).gemm_half_dim, 37.5);
  std::ofstream(path) << "[cluster]\nprocess_memory_mb = -1\n";
  try {
    load_cluster(path.string());
    ADD_FAILURE() << "a negative process_memory_mb was accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cluster.process_memory_mb must be a number >= 0"),
              std::string::npos)
        << e.what();
  }
  std::filesystem::remove(path);
}

TEST(Planner, UnknownPresetsSayWhatIsKnown) {
  try {
    model_preset("gpt5");
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("gpt2-124m"), std::string::npos);
  }
  EXPECT_THROW(cluster_preset("tpu"), ValueError);
}

}  // namespace
}  // namespace meshtrain::plan
