// Shared by the end-to-end fault tests (checkpoint crashes, full disk, rollback, hangs, lost
// nodes and links): a prepared tiny dataset per test program, the command line of a tiny
// deterministic training run, and helpers to start runs and read what they left behind.
#pragma once

#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/safetensors.h"
#include "tests/support/child_process.h"
#include "tests/support/run_command.h"
#include "tests/support/wait.h"

namespace meshtrain::testing {

inline const std::string kBinDir = MESHTRAIN_BINARY_DIR;
inline const std::string kMeshtrainBin = kBinDir + "/meshtrain";
inline const std::string kMeshrunBin = kBinDir + "/meshrun";

class TrainRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    namespace fs = std::filesystem;
    data_root_ = fs::temp_directory_path() / ("mt_ckptrun_" + std::to_string(::getpid()));
    fs::create_directories(data_root_);
    std::ofstream text(data_root_ / "text.txt");
    for (int i = 0; i < 6000; ++i)
      text << "line " << i % 89 << " of the text, word " << (i * 7) % 31 << ".\n";
    text.close();
    CommandResult r =
        run_command(kMeshtrainBin + " data prepare --input " + (data_root_ / "text.txt").string() +
                    " --out " + (data_root_ / "data").string() + " --val-fraction 0.1");
    ASSERT_EQ(r.status, 0) << r.output;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(data_root_); }

  void SetUp() override {
    dir_ = data_root_ / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::create_directories(dir_);
  }

  // A tiny model with a constant learning rate: a run of N steps and the first N steps of a
  // longer run are the same computation.
  static std::string train_args(const std::filesystem::path& out, int64_t steps, int64_t interval,
                                const std::string& extra = "") {
    return "train --set data.dir=" + (data_root_ / "data").string() +
           " --set train.out_dir=" + out.string() +
           " --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2"
           " --set model.block_size=32 --set data.batch_size=4 --set train.threads=1"
           " --set data.val_batches=2 --set train.eval_interval=0 --set train.log_interval=1"
           " --set train.sample_tokens=0 --set optim.schedule=constant"
           " --set optim.warmup_steps=3 --set dist.timeout_s=30 --set train.steps=" +
           std::to_string(steps) + " --set ckpt.interval=" + std::to_string(interval) + " " + extra;
  }

  static std::string file_bytes(const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

  // Starts `sh -c "exec CMD"` with stdout and stderr going to `log`; killed and reaped when the
  // handle goes.
  static ChildProcess spawn(const std::string& cmd, const std::string& log) {
    return spawn_shell(cmd, log);
  }

  // Runs `command` (a 2-rank meshrun with --max-restarts 1 of a 20-step job saving every 5
  // steps into `out`, started with MESHTRAIN_TEST_CKPT_STALL_AT_STEP=10), SIGKILLs rank 1 while
  // the save of step 10 is half written, and checks that meshrun restarts the job, which resumes
  // from step 5 and finishes. Callers stop on HasFatalFailure().
  void kill_rank1_mid_save_and_resume(const std::filesystem::path& out,
                                      const std::string& command) {
    const std::string log = (dir_ / "run.log").string();
    ChildProcess job = spawn(command, log);
    ASSERT_TRUE(job.started());
    const auto midway_file = out / "checkpoints" / "step_10.tmp" / "model_rank00001.safetensors";
    const bool midway =
        wait_until([&] { return std::filesystem::exists(midway_file); }, std::chrono::seconds(90));
    const std::vector<pid_t> workers = children_of(job.pid());
    ASSERT_TRUE(midway) << file_bytes(log);
    ASSERT_EQ(workers.size(), 2u) << file_bytes(log);
    ::kill(workers[1], SIGKILL);
    const std::optional<int> status = job.wait_for(std::chrono::seconds(180));
    const std::string output = file_bytes(log);
    ASSERT_TRUE(status.has_value()) << "meshrun did not finish after the restart\n" << output;
    ASSERT_TRUE(WIFEXITED(*status)) << output;
    ASSERT_EQ(WEXITSTATUS(*status), 0) << output;
    EXPECT_NE(output.find("restart 1 of 1"), std::string::npos) << output;
    EXPECT_NE(output.find("(step 5 of 20)"), std::string::npos) << output;
  }

  // The command prefix that launches `nproc` local ranks of meshtrain under meshrun, with
  // meshrun's own `flags` (e.g. "--max-restarts 1").
  static std::string meshrun(int nproc, const std::string& flags = "") {
    return kMeshrunBin + " --nproc-per-node " + std::to_string(nproc) + " --grace-period 5 " +
           (flags.empty() ? "" : flags + " ") + "-- " + kMeshtrainBin + " ";
  }

  // The largest difference between two runs' final weights (model.safetensors in each run
  // directory): inf when the files hold other tensors or shapes. `same_bits`: whether every
  // tensor is bitwise equal.
  static float weights_difference(const std::filesystem::path& a, const std::filesystem::path& b,
                                  bool* same_bits = nullptr) {
    const auto x = ckpt::load_safetensors((a / "model.safetensors").string());
    const auto y = ckpt::load_safetensors((b / "model.safetensors").string());
    if (same_bits) *same_bits = false;
    if (x.tensors.size() != y.tensors.size() || y.tensors.empty()) return INFINITY;
    bool equal = true;
    float worst = 0;
    for (const auto& [name, t] : y.tensors) {
      if (!x.contains(name) || x.at(name).shape() != t.shape()) return INFINITY;
      equal = equal && std::memcmp(x.at(name).data_ptr(), t.data_ptr(), t.nbytes()) == 0;
      const std::vector<float> p = x.at(name).to_vector(), q = t.to_vector();
      for (size_t i = 0; i < p.size(); ++i) worst = std::max(worst, std::fabs(p[i] - q[i]));
    }
    if (same_bits) *same_bits = equal;
    return worst;
  }

  // True when both safetensors files hold the same tensors with the same bytes; else `why`.
  static bool same_tensors(const std::filesystem::path& a, const std::filesystem::path& b,
                           std::string* why) {
    const auto x = ckpt::load_safetensors(a.string());
    const auto y = ckpt::load_safetensors(b.string());
    if (x.tensors.size() != y.tensors.size() || y.tensors.empty()) {
      *why =
          std::to_string(x.tensors.size()) + " vs " + std::to_string(y.tensors.size()) + " tensors";
      return false;
    }
    for (const auto& [name, t] : y.tensors) {
      if (!x.contains(name) || x.at(name).shape() != t.shape() ||
          std::memcmp(x.at(name).data_ptr(), t.data_ptr(), t.nbytes()) != 0) {
        *why = "tensor '" + name + "' differs";
        return false;
      }
    }
    return true;
  }

  // step -> the value of `key` in rank 0's metrics.jsonl (a resumed run appends; the last
  // record wins).
  template <typename T>
  static std::map<int64_t, T> by_step(const std::filesystem::path& out, const std::string& key) {
    std::map<int64_t, T> m;
    std::ifstream in(out / "metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains(key)) m[j["step"].get<int64_t>()] = j[key].template get<T>();
    }
    return m;
  }
  static std::map<int64_t, float> losses(const std::filesystem::path& out) {
    return by_step<float>(out, "loss");
  }
  // Before clipping.
  static std::map<int64_t, double> grad_norms(const std::filesystem::path& out) {
    return by_step<double>(out, "grad_norm");
  }
  // Whether a complete checkpoint of `step` or later is under `out`: a wait for "step N saved"
  // that ckpt.keep_last cannot hide (it drops step N a few saves later, which a loaded machine
  // can let happen between two polls).
  static bool saved_from(const std::filesystem::path& out, int64_t step) {
    const auto steps = ckpt::list_complete_steps((out / "checkpoints").string());
    return !steps.empty() && steps.back() >= step;
  }
  static int64_t last_step(const std::filesystem::path& out) {
    const auto l = losses(out);
    return l.empty() ? 0 : l.rbegin()->first;
  }

  // Polls until `pred` holds (true) or `limit` passes (false).
  template <typename Pred>
  static bool wait_until(Pred pred, std::chrono::milliseconds limit) {
    return testing::wait_until(pred, limit, std::chrono::milliseconds(20));
  }

  // The pids of a process's children (a meshrun's workers), in start order.
  static std::vector<pid_t> meshrun_workers(pid_t pid) { return children_of(pid); }

  static std::filesystem::path data_root_;
  std::filesystem::path dir_;
};

inline std::filesystem::path TrainRunTest::data_root_;

}  // namespace meshtrain::testing
