// `meshtrain ckpt inspect|verify|export`, run as the built program on checkpoints written by
// two simulated ranks. The export is read back by PyTorch through the pure-Python safetensors
// reader (skipped when Debian's python3 has no torch).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/safetensors.h"
#include "tests/ckpt/ckpt_test_util.h"
#include "tests/support/capability.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;
using meshtrain::testing::TempDir;
using testing::bitwise_equal;
using testing::pattern;

const std::string kMeshtrain = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain";
constexpr const char* kPython = "/usr/bin/python3";

struct Result {
  int status = -1;
  std::string out;
};

Result run(const std::string& args) {
  Result r;
  FILE* p = ::popen((kMeshtrain + " " + args + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) r.out.append(buf.data(), n);
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// Two ranks: replicated "wte.weight", "lm_head.bias" split on dim 0 (model), and optimizer state.
void write_checkpoints(const std::string& root) {
  testing::ThreadBarrier barrier(2);
  testing::run_ranks(2, [&](int64_t rank) {
    WriterOptions wo;
    wo.root = root;
    wo.rank = rank;
    wo.layout = {.world_size = 2, .dp = 2};
    wo.barrier = barrier.callback();
    CheckpointWriter writer(wo);
    for (int64_t step : {4, 8}) {
      RankShards shards;
      shards.add_replicated("model", "wte.weight", pattern({6, 4}, static_cast<float>(step)));
      const Tensor bias = pattern({9}, 0.5f);
      const RowRange r = even_rows(9, rank, 2);
      shards.add_dim0("model", "lm_head.bias", bias.slice(r.offset, r.offset + r.length), 9,
                      r.offset);
      shards.add_replicated("optim", "exp_avg.wte.weight", pattern({6, 4}, -1.0f));
      writer.save(step, shards, {{"step", step}, {"epoch", 2}, {"sampler", {{"offset", 17}}}});
    }
    writer.wait();
  });
}

class CkptCli : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(kMeshtrain)) << kMeshtrain << " is missing: build the meshtrain target";
    root_ = dir_.file("ckpt");
    write_checkpoints(root_);
  }
  TempDir dir_;
  std::string root_;
};

TEST_F(CkptCli, InspectSummarisesTheManifest) {
  Result r = run("ckpt inspect " + root_);
  ASSERT_EQ(r.status, 0) << r.out;
  EXPECT_NE(r.out.find("step 8, epoch 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("world: 2 ranks (dp 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wte.weight"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("[6, 4]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("replicated (2 copies)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("dim0 over 2 shards [r0:0+5, r1:5+4]"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("model_rank00001.safetensors"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"offset\":17"), std::string::npos) << r.out;

  Result step4 = run("ckpt inspect " + root_ + "/step_4");
  ASSERT_EQ(step4.status, 0) << step4.out;
  EXPECT_NE(step4.out.find("step 4,"), std::string::npos) << step4.out;

  Result json = run("ckpt inspect --json " + root_);
  ASSERT_EQ(json.status, 0);
  EXPECT_EQ(nlohmann::json::parse(json.out).at("step"), 8);
}

TEST_F(CkptCli, VerifyExitCodes) {
  Result good = run("ckpt verify " + root_);
  EXPECT_EQ(good.status, 0) << good.out;
  EXPECT_NE(good.out.find("ok:"), std::string::npos);

  testing::flip_byte(root_ + "/step_8/model_rank00001.safetensors");
  testing::truncate_by(root_ + "/step_8/optim_rank00000.safetensors", 3);
  Result bad = run("ckpt verify " + root_);
  EXPECT_EQ(bad.status, 1) << bad.out;
  // One line per bad file, naming it.
  EXPECT_EQ(std::count(bad.out.begin(), bad.out.end(), '\n'), 2) << bad.out;
  EXPECT_NE(bad.out.find("model_rank00001.safetensors: xxh3"), std::string::npos) << bad.out;
  EXPECT_NE(bad.out.find("optim_rank00000.safetensors"), std::string::npos) << bad.out;

  EXPECT_EQ(run("ckpt verify " + root_ + "/step_4").status, 0);
  Result missing = run("ckpt verify " + dir_.file("nowhere"));
  EXPECT_NE(missing.status, 0);
  EXPECT_NE(missing.out.find("error"), std::string::npos) << missing.out;
}

TEST_F(CkptCli, ExportConsolidatesTheModel) {
  const std::string out = dir_.file("model.safetensors");
  Result r = run("ckpt export " + root_ + " --out " + out);
  ASSERT_EQ(r.status, 0) << r.out;
  SafetensorsFile f = load_safetensors(out);
  ASSERT_EQ(f.tensors.size(), 2u);  // the model group only
  EXPECT_TRUE(bitwise_equal(f.at("wte.weight"), pattern({6, 4}, 8.0f)));
  EXPECT_TRUE(bitwise_equal(f.at("lm_head.bias"), pattern({9}, 0.5f)));
  EXPECT_EQ(f.metadata.at("meshtrain_step"), "8");

  // A damaged checkpoint is not exported.
  testing::flip_byte(root_ + "/step_8/model_rank00000.safetensors");
  Result bad = run("ckpt export " + root_ + " --out " + dir_.file("bad.safetensors"));
  EXPECT_NE(bad.status, 0);
  EXPECT_FALSE(fs::exists(dir_.file("bad.safetensors")));
}

TEST_F(CkptCli, ExportIsLoadableByPyTorch) {
  MT_SKIP_UNLESS(
      "torch",
      fs::exists(kPython) &&
          std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0,
      kPython << " has no torch (install python3-torch)");
  const std::string out = dir_.file("model.safetensors");
  ASSERT_EQ(run("ckpt export " + root_ + "/step_4 --out " + out).status, 0);
  const std::string script = dir_.file("check.py");
  std::ofstream(script) << R"PY(import sys
sys.path.insert(0, sys.argv[1])
import torch
import st
tensors, meta = st.load(sys.argv[2])
def pattern(shape, salt):
    n = 1
    for d in shape:
        n *= d
    return ((torch.arange(n) % 17).float() * 0.25 - 2.0 + salt).reshape(shape)
assert list(tensors) == ["wte.weight", "lm_head.bias"], list(tensors)
assert tensors["wte.weight"].dtype == torch.float32
assert torch.equal(tensors["wte.weight"], pattern([6, 4], 4.0)), tensors["wte.weight"]
assert torch.equal(tensors["lm_head.bias"], pattern([9], 0.5)), tensors["lm_head.bias"]
assert meta["meshtrain_step"] == "4", meta
print("torch ok")
)PY";
  const std::string cmd =
      std::string(kPython) + " " + script + " " + MESHTRAIN_SOURCE_DIR + "/tests/python " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

}  // namespace
}  // namespace meshtrain::ckpt
