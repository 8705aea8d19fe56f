// The 3D mesh end to end with the built meshtrain and meshrun programs on a tiny model: 8 ranks
// as pp 2 x dp 2 x tp 2 (with and without sequence parallelism, dropout on) train like one rank
// on the same global batch, on one host and on two network-namespace hosts (4 ranks each: the tp
// groups inside a host over shm, the pipeline's stages on different hosts, over tcp), and the
// final weights file holds the whole tensors.
//
// To 1e-5 relative, not bitwise: the tensor-parallel sums and the replicas' average add in
// another order than one rank (tests/parallel/pipeline_tp_test.cpp says which).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/safetensors.h"
#include "tests/comm/netns_lab.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/capability.h"
#include "tests/support/run_command.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

constexpr int64_t kSteps = 8;

class PipelineTensorParallelRun : public TrainRunTest {
 protected:
  // A global batch of 4 sequences: one sequence a micro-batch x accumulation x dp replicas.
  // Four layers (two blocks, the embedding and the head), so that two stages hold two each.
  static std::string layout(int accum, const std::string& extra) {
    return "--set model.n_layer=2 --set data.batch_size=1 --set model.dropout=0.1 "
           "--set train.grad_accum_steps=" +
           std::to_string(accum) + " " + extra;
  }
  static std::string three_d(bool sp, const std::string& schedule) {
    return "--set parallel.pp=2 --set parallel.tp=2 --set parallel.schedule=" + schedule +
           (sp ? " --set parallel.sequence_parallel=true" : "");
  }

  // The one-rank reference of `steps` steps into dir_/ref (once per test).
  void run_reference() {
    ref_ = dir_ / "ref";
    CommandResult one =
        run_command(kMeshtrainBin + " " + train_args(ref_, kSteps, 0, layout(4, "")));
    ASSERT_EQ(one.status, 0) << one.output;
    ASSERT_EQ(losses(ref_).size(), static_cast<size_t>(kSteps)) << one.output;
  }

  // Losses and gradient norms within 1e-5 relative of the reference at every step, and the
  // final weights (whole tensors, the reference's names and shapes) within 1e-4.
  void expect_matches_reference(const fs::path& out, const std::string& name) {
    const auto want = losses(ref_), got = losses(out);
    ASSERT_EQ(got.size(), static_cast<size_t>(kSteps));
    const auto want_norms = grad_norms(ref_), got_norms = grad_norms(out);
    ASSERT_EQ(got_norms.size(), static_cast<size_t>(kSteps));
    double worst = 0;
    for (int64_t step = 1; step <= kSteps; ++step) {
      const double rel = std::fabs(got.at(step) - want.at(step)) / want.at(step);
      EXPECT_LE(rel, 1e-5) << "step " << step << ": " << got.at(step) << " vs " << want.at(step);
      worst = std::max(worst, rel);
      EXPECT_NEAR(got_norms.at(step), want_norms.at(step), 1e-5 * want_norms.at(step))
          << "step " << step;
    }
    const auto ref_weights = ckpt::load_safetensors((ref_ / "model.safetensors").string());
    const auto weights = ckpt::load_safetensors((out / "model.safetensors").string());
    ASSERT_EQ(weights.tensors.size(), ref_weights.tensors.size());
    float worst_weight = 0;
    for (const auto& [tensor, t] : ref_weights.tensors) {
      ASSERT_TRUE(weights.contains(tensor)) << tensor;
      ASSERT_EQ(weights.at(tensor).shape(), t.shape()) << tensor;
      const std::vector<float> a = weights.at(tensor).to_vector(), b = t.to_vector();
      float diff = 0;
      for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::fabs(a[i] - b[i]));
      EXPECT_LE(diff, 1e-4f) << tensor;
      worst_weight = std::max(worst_weight, diff);
    }
    std::printf(
        "%s: largest relative loss difference to one rank over %lld steps %.3g, "
        "largest weight difference %.3g\n",
        name.c_str(), static_cast<long long>(kSteps), worst, worst_weight);
  }

  fs::path ref_;
};

TEST_F(PipelineTensorParallelRun, EightRanksMatchOneRank) {
  run_reference();
  if (HasFatalFailure()) return;
  struct Case {
    const char* name;
    bool sp;
    const char* schedule;
    const char* says;
  };
  for (const Case& c :
       {Case{"dp2pp2tp2", false, "1f1b",
             "pipeline 1f1b over 2 stages x 2 data-parallel replicas x tensor parallelism over 2 "
             "ranks"},
        Case{"dp2pp2tp2sp", true, "gpipe",
             "pipeline gpipe over 2 stages x 2 data-parallel replicas x tensor parallelism over 2 "
             "ranks with sequence parallelism"}}) {
    SCOPED_TRACE(c.name);
    const fs::path out = dir_ / c.name;
    // An evaluation every 4 steps runs through the stages' shards too.
    CommandResult r =
        run_command(meshrun(8) + train_args(out, kSteps, 0,
                                            layout(2, three_d(c.sp, c.schedule) +
                                                          " --set train.eval_interval=4 "
                                                          "--set dist.check_interval=1")));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(c.says), std::string::npos) << r.output;
    expect_matches_reference(out, c.name);
  }
}

TEST_F(PipelineTensorParallelRun, BadLayoutsAreOneLineAndStatus2) {
  struct Bad {
    int nproc;
    std::string set;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {1, "--set parallel.pp=2 --set parallel.tp=3",
       "model.n_embd (32) is not divisible by parallel.tp (3)"},
      {1, "--set parallel.pp=2 --set parallel.tp=4 --set model.n_embd=64",
       "model.n_head (2) is not divisible by parallel.tp (4)"},
      {1, "--set parallel.pp=2 --set parallel.sequence_parallel=true",
       "parallel.sequence_parallel = true needs tensor parallelism"},
      {1,
       "--set parallel.pp=2 --set parallel.tp=2 --set parallel.sequence_parallel=true "
       "--set model.block_size=33",
       "model.block_size (33) is not divisible by parallel.tp (2), which "
       "parallel.sequence_parallel needs"},
      {1,
       "--set parallel.pp=2 --set parallel.tp=2 --set parallel.schedule=interleaved "
       "--set parallel.virtual_stages=2 --set model.n_layer=6",
       "the interleaved schedule's 4 chunks (parallel.pp x parallel.virtual_stages) do not "
       "divide model.n_layer = 6"},
      {1, "--set parallel.pp=2 --set parallel.tp=2 --set parallel.zero_stage=3",
       "parallel.tp = 2 and parallel.zero_stage = 3 cannot be combined yet"},
      {1, "--set parallel.pp=2 --set parallel.tp=2 --set train.precision=bf16",
       "parallel.tp = 2 and train.precision = bf16 cannot be combined yet"},
      {1, "--set parallel.pp=2 --set parallel.tp=2",
       "parallel.pp x parallel.tp = 4 does not divide the 1 ranks"},
      {6, "--set parallel.pp=2 --set parallel.tp=2",
       "parallel.pp x parallel.tp = 4 does not divide the 6 ranks"},
  };
  for (const Bad& b : bad) {
    const std::string args = train_args(dir_, 1, 0, "--set model.n_layer=2 " + b.set);
    CommandResult r =
        run_command(b.nproc == 1 ? kMeshtrainBin + " " + args : meshrun(b.nproc) + args);
    EXPECT_NE(r.output.find(b.says), std::string::npos) << b.set << "\n" << r.output;
    if (b.nproc == 1) {
      EXPECT_EQ(r.status, 2) << b.set << "\n" << r.output;
      EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
    } else {
      EXPECT_NE(r.status, 0) << r.output;
    }
  }
}

// Two hosts of 4 ranks each: rank = host x 4 + local rank, and pp varies slowest, so stage 0 is
// host 0 and stage 1 host 1; each tp pair shares a host (shm), each pipeline pair spans the two
// (tcp), and the dp replicas of a stage share its host.
TEST_F(PipelineTensorParallelRun, TwoHostsMatchOneRank) {
  comm::testing::NetnsLab lab(2);
  MT_SKIP_UNLESS("netns", lab.available(), lab.unavailable_reason());
  run_reference();
  if (HasFatalFailure()) return;
  const fs::path out = dir_ / "hosts";
  const std::string endpoint = lab.address(0) + ":29531";
  const std::string train =
      kMeshtrainBin + " " +
      train_args(out, kSteps, 0, layout(2, three_d(true, "1f1b") + " --set dist.check_interval=1"));
  std::vector<fs::path> logs;
  std::vector<ChildProcess> agents;
  for (int h = 0; h < 2; ++h) {
    logs.push_back(dir_ / ("host" + std::to_string(h) + ".log"));
    const std::string cmd = "exec " + kMeshrunBin + " --nnodes 2 --node-rank " + std::to_string(h) +
                            " --rdzv-endpoint " + endpoint +
                            " --rdzv-timeout 60 --grace-period 5 --nproc-per-node 4 -- " + train;
    agents.push_back(lab.spawn(h, {"/bin/sh", "-c", cmd},
                               {{"MESHTRAIN_TOKEN", "three-d-token"}, {"OMP_NUM_THREADS", "1"}},
                               logs.back().string()));
    ASSERT_TRUE(agents.back().started());
  }
  auto all_logs = [&] {
    std::string s;
    for (size_t h = 0; h < logs.size(); ++h)
      s += "---- host " + std::to_string(h) + "\n" + file_bytes(logs[h]);
    return s;
  };
  for (size_t h = 0; h < agents.size(); ++h) {
    const auto status = agents[h].wait_for(240s);
    ASSERT_TRUE(status.has_value()) << "host " << h << " did not finish\n" << all_logs();
    ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << all_logs();
  }
  EXPECT_NE(all_logs().find("pipeline 1f1b over 2 stages x 2 data-parallel replicas x tensor "
                            "parallelism over 2 ranks with sequence parallelism"),
            std::string::npos)
      << all_logs();
  expect_matches_reference(out, "two hosts, pp 2 x dp 2 x tp 2 with sequence parallelism");
}

}  // namespace
}  // namespace meshtrain::testing
