// ckpt.keep_best end to end on two ranks: a run whose learning rate warms up to far too much
// (1.0 over all 24 steps) improves at first and then diverges, so the best validation loss is
// not the newest. The best step's checkpoint must survive keep_last retention, `best` must name
// it, `meshtrain ckpt export ROOT/best` must export exactly its weights, and ckpt.resume_from =
// best must continue from it with the same losses the first run had after that step.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/safetensors.h"
#include "tests/runtime/train_run_fixture.h"

namespace meshtrain::testing {
namespace {

namespace fs = std::filesystem;

class BestCheckpointRun : public TrainRunTest {
 protected:
  static std::string run(const fs::path& out, const std::string& extra = "") {
    return kMeshrunBin + " --nproc-per-node 2 --grace-period 5 -- " + kMeshtrainBin + " " +
           train_args(out, 24, 4,
                      "--set optim.lr=1.0 --set optim.warmup_steps=24 --set train.eval_interval=2 "
                      "--set ckpt.keep_last=2 --set ckpt.keep_best=true " +
                          extra);
  }
  // step -> val_loss from rank 0's metrics.jsonl (the last record of a step wins).
  static std::map<int64_t, float> val_losses(const fs::path& out) {
    std::map<int64_t, float> m;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("val_loss") && j["step"].get<int64_t>() > 0)
        m[j["step"].get<int64_t>()] = j["val_loss"].get<float>();
    }
    return m;
  }
};

TEST_F(BestCheckpointRun, TheBestSurvivesRetentionExportsAndResumes) {
  const fs::path out = dir_ / "run";
  const fs::path root = out / "checkpoints";
  const CommandResult first = run_command(run(out));
  ASSERT_EQ(first.status, 0) << first.output;

  // The best is the lowest validation loss of the run, and it is not the newest step.
  const std::map<int64_t, float> val = val_losses(out);
  ASSERT_EQ(val.size(), 12u) << first.output;
  int64_t best_step = val.begin()->first;
  for (const auto& [step, v] : val)
    if (v < val.at(best_step)) best_step = step;
  ASSERT_LT(best_step, 20) << "the run did not get worse after its best; it cannot show "
                              "that the best outlives keep_last";
  EXPECT_GT(val.at(24), val.at(best_step));

  // Retention kept the newest two and the best, and `best` names it.
  EXPECT_EQ(ckpt::list_complete_steps(root.string()), (std::vector<int64_t>{best_step, 20, 24}));
  EXPECT_EQ(ckpt::read_best(root.string()), ckpt::step_dir_name(best_step));
  EXPECT_EQ(ckpt::read_latest(root.string()), std::optional<std::string>("step_24"));
  const ckpt::Checkpoint best =
      ckpt::Checkpoint::open((root / ckpt::step_dir_name(best_step)).string());
  EXPECT_EQ(best.train_state().at("val_loss").get<float>(), val.at(best_step));
  EXPECT_TRUE(best.train_state().at("best").get<bool>());

  // The export of ROOT/best is that checkpoint's model, bit for bit.
  const fs::path exported = dir_ / "best.safetensors";
  const CommandResult exp = run_command(kMeshtrainBin + " ckpt export " + (root / "best").string() +
                                        " --out " + exported.string());
  ASSERT_EQ(exp.status, 0) << exp.output;
  EXPECT_NE(exp.output.find("from step " + std::to_string(best_step) + " "), std::string::npos)
      << exp.output;
  const ckpt::SafetensorsFile file = ckpt::load_safetensors(exported.string());
  const ckpt::NamedTensors model = best.load_group("model");
  ASSERT_EQ(file.tensors.size(), model.size());
  for (const auto& [name, t] : model) {
    const Tensor& e = file.at(name);
    ASSERT_EQ(e.nbytes(), t.nbytes()) << name;
    EXPECT_EQ(std::memcmp(e.data_ptr(), t.data_ptr(), t.nbytes()), 0) << name;
  }

  // Resuming from the best retrains the steps after it exactly as the first run did.
  const std::map<int64_t, float> first_losses = losses(out);
  const CommandResult second = run_command(run(out, "--set ckpt.resume_from=best"));
  ASSERT_EQ(second.status, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from " + (root / ckpt::step_dir_name(best_step)).string() +
                               " (step " + std::to_string(best_step) + " of 24"),
            std::string::npos)
      << second.output;
  const std::map<int64_t, float> second_losses = losses(out);  // the resumed run's records win
  for (int64_t s = best_step + 1; s <= 24; ++s)
    EXPECT_EQ(second_losses.at(s), first_losses.at(s)) << "step " << s;
  // Nothing after it was better, so `best` still names it and it is still on disk.
  EXPECT_EQ(ckpt::read_best(root.string()), ckpt::step_dir_name(best_step));
  EXPECT_TRUE(fs::is_regular_file(root / ckpt::step_dir_name(best_step) / "manifest.json"));

  // ckpt.resume_from = best is where the job starts: a worker that fails after the next
  // checkpoint is restarted from that checkpoint, not sent back to the best again.
  const int64_t next_save = (best_step / 4 + 1) * 4;  // ckpt.interval = 4
  const CommandResult third = run_command(
      "env MESHTRAIN_TEST_CRASH_AT_STEP=" + std::to_string(best_step + 5) + " " + kMeshrunBin +
      " --nproc-per-node 2 --grace-period 5 --max-restarts 1 -- " + kMeshtrainBin + " " +
      train_args(out, 24, 4,
                 "--set optim.lr=1.0 --set optim.warmup_steps=24 --set train.eval_interval=2 "
                 "--set ckpt.keep_last=2 --set ckpt.keep_best=true --set ckpt.resume_from=best"));
  ASSERT_EQ(third.status, 0) << third.output;
  EXPECT_NE(third.output.find("restart 1 of this job: continuing from the latest checkpoint"),
            std::string::npos)
      << third.output;
  EXPECT_NE(third.output.find("resumed from " + (root / ckpt::step_dir_name(next_save)).string() +
                              " (step " + std::to_string(next_save) + " of 24)"),
            std::string::npos)
      << third.output;
  const std::map<int64_t, float> third_losses = losses(out);
  for (int64_t s = best_step + 1; s <= 24; ++s)
    EXPECT_EQ(third_losses.at(s), first_losses.at(s)) << "step " << s;
}

TEST_F(BestCheckpointRun, ResumingFromAMissingBestIsOneClearLine) {
  const fs::path out = dir_ / "run";
  fs::create_directories(out / "checkpoints");
  const CommandResult r =
      run_command(kMeshtrainBin + " " + train_args(out, 2, 1, "--set ckpt.resume_from=best"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ckpt.resume_from = best"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("ckpt.keep_best = true writes it"), std::string::npos) << r.output;
}

TEST_F(BestCheckpointRun, KeepBestWithoutCheckpointsIsAConfigError) {
  const CommandResult r = run_command(kMeshtrainBin + " " +
                                      train_args(dir_ / "run", 2, 0, "--set ckpt.keep_best=true"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ckpt.keep_best needs checkpoints"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace meshtrain::testing
