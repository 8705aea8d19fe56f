// End-to-end tests of the meshtrain and meshrun programs: real processes, real files.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>
#include "tests/support/run_command.h"

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace {

namespace fs = std::filesystem;

using Result = meshtrain::testing::CommandResult;
Result run(const std::string& cmd) {
  return meshtrain::testing::run_command(cmd);
}

const std::string kBin = MESHTRAIN_BINARY_DIR;
const std::string kMeshtrain = kBin + "/meshtrain";
const std::string kMeshrun = kBin + "/meshrun";

class Cli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("mt_cli_" + std::to_string(getpid()));
    fs::create_directories(dir_);
    // Real text when Debian's fortunes are installed, a generated text otherwise.
    std::ofstream text(dir_ / "text.txt");
    const fs::path fortunes = "/usr/share/games/fortunes/fortunes";
    if (fs::exists(fortunes)) {
      std::ifstream in(fortunes);
      std::string line;
      size_t n = 0;
      while (std::getline(in, line) && n < 400000) {
        text << line << "\n";
        n += line.size() + 1;
      }
    } else {
      for (int i = 0; i < 20000; ++i) text << "line " << i % 97 << " of the generated text.\n";
    }
    text.close();
    Result r = run(kMeshtrain + " data prepare --input " + (dir_ / "text.txt").string() +
                   " --out " + (dir_ / "data").string() + " --val-fraction 0.1");
    ASSERT_EQ(r.status, 0) << r.output;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  // A small, fast model on the prepared data.
  static std::string train_cmd(const std::string& out, const std::string& extra = "") {
    return kMeshtrain + " train --set data.dir=" + (dir_ / "data").string() +
           " --set train.out_dir=" + out +
           " --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4"
           " --set model.block_size=64 --set data.batch_size=8 --set train.threads=1"
           " --set train.sample_tokens=20 --set optim.warmup_steps=10 " +
           extra;
  }

  static std::vector<nlohmann::json> metrics(const fs::path& run_dir) {
    std::vector<nlohmann::json> v;
    std::ifstream in(run_dir / "metrics.jsonl");
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      auto j = nlohmann::json::parse(line);
      if (!j.contains("event")) v.push_back(j);  // step records only, not checkpoint events
    }
    return v;
  }

  static fs::path dir_;
};

fs::path Cli::dir_;

TEST_F(Cli, TrainingReducesValidationLossAndSamples) {
  const fs::path out = dir_ / "run1";
  Result r = run(train_cmd(out.string(),
                           "--set train.steps=150 --set train.eval_interval=75 "
                           "--set optim.lr=3e-3"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto m = metrics(out);
  ASSERT_FALSE(m.empty());
  const float first = m.front()["val_loss"].get<float>();
  const float last = m.back()["val_loss"].get<float>();
  EXPECT_NEAR(first, std::log(257.0f), 0.3f);
  EXPECT_LT(last, first - 2.0f) << r.output;
  EXPECT_NE(r.output.find("eta"), std::string::npos) << "progress lines show an ETA";
  ASSERT_TRUE(fs::exists(out / "model.safetensors"));
  Result s = run(kMeshtrain + " sample --weights " + (out / "model.safetensors").string() +
                 " --prompt 'The ' --tokens 30");
  EXPECT_EQ(s.status, 0) << s.output;
  EXPECT_EQ(s.output.rfind("The ", 0), 0u) << s.output;
}

TEST_F(Cli, TwoRanksTrainLikeOneRankWithTheGlobalBatch) {
  const fs::path one = dir_ / "one", two = dir_ / "two";
  const std::string common = "--set train.steps=12 --set train.eval_interval=0 ";
  Result a = run(train_cmd(one.string(), common + "--set data.batch_size=8"));
  ASSERT_EQ(a.status, 0) << a.output;
  Result b =
      run(kMeshrun + " --nproc-per-node 2 -- " +
          train_cmd(two.string(), common + "--set data.batch_size=4 --set dist.backend=shm"));
  ASSERT_EQ(b.status, 0) << b.output;
  auto ma = metrics(one), mb = metrics(two);
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 1; i < ma.size(); ++i) {
    const double la = ma[i]["loss"].get<double>(), lb = mb[i]["loss"].get<double>();
    EXPECT_NEAR(lb, la, 1e-4 * la) << "step " << i;
  }
}

TEST_F(Cli, GradientAccumulationMatchesLargerBatch) {
  const fs::path big = dir_ / "big", acc = dir_ / "acc";
  const std::string common = "--set train.steps=8 --set train.eval_interval=0 ";
  Result a = run(train_cmd(big.string(), common + "--set data.batch_size=8"));
  ASSERT_EQ(a.status, 0) << a.output;
  Result b = run(
      train_cmd(acc.string(), common + "--set data.batch_size=4 --set train.grad_accum_steps=2"));
  ASSERT_EQ(b.status, 0) << b.output;
  auto ma = metrics(big), mb = metrics(acc);
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 1; i < ma.size(); ++i)
    EXPECT_NEAR(mb[i]["loss"].get<double>(), ma[i]["loss"].get<double>(), 1e-4) << "step " << i;
}

TEST_F(Cli, ConfigMismatchBetweenRanksIsNamed) {
  Result r = run(kMeshrun + " --nproc-per-node 2 -- sh -c '" +
                 train_cmd((dir_ / "mismatch").string(), "--set train.steps=2") +
                 " --set optim.lr=0.00$((RANK+1))'");
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.output.find("optim.lr differs"), std::string::npos) << r.output;
}

TEST_F(Cli, UnknownConfigKeyIsOneClearLine) {
  Result r = run(kMeshtrain + " train --set optim.lrr=1");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.output.find("optim.lrr"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("optim.lr"), std::string::npos) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// Token ids past model.vocab_size used to fail at step 1 inside the embedding kernel; now the
// run stops at start-up with one line naming the shard, the id and the key.
TEST_F(Cli, DataPastTheVocabularyStopsBeforeTheFirstStep) {
  Result r = run(train_cmd((dir_ / "vocab").string(), "--set model.vocab_size=10"));
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("meshtrain: error: token shard " + (dir_ / "data").string()),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("outside model.vocab_size = 10"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("embedding:"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("step 1/"), std::string::npos) << r.output;
}

TEST_F(Cli, MeshrunNumbersOutOfRangeAreOnePlainLine) {
  for (const std::string& flags :
       {std::string("--nproc-per-node 0"), std::string("--nproc-per-node 1 --max-restarts -1"),
        std::string("--nproc-per-node 1 --rdzv-timeout 0")}) {
    Result r = run(kMeshrun + " " + flags + " -- true");
    EXPECT_NE(r.status, 0) << flags << "\n" << r.output;
    const std::string first = r.output.substr(0, r.output.find('\n'));
    EXPECT_LT(first.size(), 120u) << r.output;
    EXPECT_TRUE(first.find("must be at least") != std::string::npos ||
                first.find("must be more than") != std::string::npos)
        << r.output;
    EXPECT_EQ(r.output.find("179769313486"), std::string::npos) << r.output;
  }
}

TEST_F(Cli, WrongTypeMissingFileAndShortDataset) {
  Result t = run(kMeshtrain + " train --set model.n_layer=abc");
  EXPECT_EQ(t.status, 2);
  EXPECT_NE(t.output.find("model.n_layer"), std::string::npos) << t.output;

  Result f = run(kMeshtrain + " train --config /nonexistent/meshtrain.toml");
  EXPECT_EQ(f.status, 2);
  EXPECT_NE(f.output.find("/nonexistent/meshtrain.toml"), std::string::npos) << f.output;

  const fs::path tiny = dir_ / "tiny.txt";
  std::ofstream(tiny) << "far too short\n";
  Result p = run(kMeshtrain + " data prepare --input " + tiny.string() + " --out " +
                 (dir_ / "tiny").string());
  ASSERT_EQ(p.status, 0) << p.output;
  Result s = run(kMeshtrain + " train --set data.dir=" + (dir_ / "tiny").string() +
                 " --set train.out_dir=" + (dir_ / "tinyrun").string());
  EXPECT_EQ(s.status, 2);
  EXPECT_NE(s.output.find("tokens"), std::string::npos) << s.output;

  Result m =
      run(kMeshtrain + " data prepare --input /nonexistent.txt --out " + (dir_ / "x").string());
  EXPECT_EQ(m.status, 2);
  EXPECT_NE(m.output.find("/nonexistent.txt"), std::string::npos) << m.output;

  Result w = run(kMeshtrain + " sample --weights /nonexistent.safetensors");
  EXPECT_EQ(w.status, 2);
  EXPECT_NE(w.output.find("/nonexistent.safetensors"), std::string::npos) << w.output;
}

TEST_F(Cli, HelpListsEverySubcommandAndConfigKey) {
  Result h = run(kMeshtrain + " --help");
  EXPECT_EQ(h.status, 0);
  for (const char* cmd : {"train", "sample", "data"})
    EXPECT_NE(h.output.find(cmd), std::string::npos) << h.output;
  Result c = run(kMeshtrain + " train --help-config");
  EXPECT_EQ(c.status, 0);
  for (const char* key : {"model.n_layer", "optim.lr", "train.steps", "dist.comm_hook"})
    EXPECT_NE(c.output.find(key), std::string::npos) << key;
}

}  // namespace

namespace {

TEST(CliBench, BenchCommRunsTheCollectiveBenchmarkWithItsArguments) {
  Result r = run(kMeshtrain +
                 " bench comm --backend shm --world-size 2 --min-bytes 4096 --max-bytes 8192"
                 " --iters 2 --warmup 1 2>&1");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("comm_bench backend=shm op=all_reduce ranks=2"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("\"bytes\":8192"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
  // The benchmark's own --help, not meshtrain's.
  Result h = run(kMeshtrain + " bench comm --help 2>&1");
  EXPECT_EQ(h.status, 0) << h.output;
  EXPECT_NE(h.output.find("--world-size"), std::string::npos) << h.output;
  Result bad = run(kMeshtrain + " bench 2>&1");
  EXPECT_EQ(bad.status, 2) << bad.output;
}

}  // namespace
