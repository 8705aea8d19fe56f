// The trainer's log lines through the real program: by default human lines with time, rank and
// step, preceded once by the effective configuration; with --log-format json every line of
// stdout is a JSON object with time and rank, and step lines carry the step and the loss.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

namespace meshtrain::obs {
namespace {

namespace fs = std::filesystem;

const std::string kMeshtrain = std::string(MESHTRAIN_BINARY_DIR) + "/meshtrain";

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) out += buf.data();
  *status = pclose(p);
  return out;
}

class TrainLogs : public ::testing::Test {
 protected:
  void SetUp() override {
    if (::access(kMeshtrain.c_str(), X_OK) != 0)
      FAIL() << "meshtrain is missing from the build directory; the build makes it";
    dir_ = fs::temp_directory_path() / ("mt_logs_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream text(dir_ / "t.txt");
    for (int i = 0; i < 2000; ++i) text << "line " << i % 97 << " of the generated text.\n";
    text.close();
    int st = 0;
    run(kMeshtrain + " data prepare --input " + (dir_ / "t.txt").string() + " --out " +
            (dir_ / "data").string() + " --val-fraction 0.1 2>&1",
        &st);
    ASSERT_EQ(st, 0);
  }
  void TearDown() override {
    if (!dir_.empty()) fs::remove_all(dir_);
  }
  std::string train(const std::string& extra) {
    int st = 0;
    std::string out =
        run(kMeshtrain + " train --set data.dir=" + (dir_ / "data").string() +
                " --set train.out_dir=" + (dir_ / "run").string() +
                " --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2"
                " --set model.block_size=32 --set data.batch_size=4"
                " --set train.threads=1 --set train.steps=4 --set train.log_interval=2"
                " --set train.sample_tokens=0 --set train.save_weights=false " +
                extra,
            &st);
    EXPECT_EQ(st, 0) << out;
    return out;
  }
  fs::path dir_;
};

TEST_F(TrainLogs, TextLinesCarryTimeRankAndStepAfterTheConfiguration) {
  const std::string out = train("");
  EXPECT_NE(out.find("rank 0 step 2 | step 2/4 loss"), std::string::npos) << out;
  const size_t config = out.find("effective configuration:");
  ASSERT_NE(config, std::string::npos) << out;
  EXPECT_EQ(out.find("effective configuration:", config + 1), std::string::npos);  // once
  EXPECT_NE(out.find("[optim]"), std::string::npos) << "the TOML follows";
  EXPECT_LT(config, out.find("step 2/4"));
}

TEST_F(TrainLogs, JsonFormatGivesOneObjectPerLine) {
  const std::string out = train("--log-format json");
  std::istringstream in(out);
  std::string line;
  int steps = 0, configs = 0, lines = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    ++lines;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << "not JSON: " << line;
    if (j.value("msg", "") == "done") continue;
    EXPECT_TRUE(j.contains("time")) << line;
    EXPECT_EQ(j["rank"], 0) << line;
    if (j.contains("config")) ++configs;
    if (j.contains("step") && j.contains("loss")) {
      ++steps;
      EXPECT_TRUE(j["loss"].is_number());
    }
  }
  EXPECT_EQ(configs, 1);
  EXPECT_EQ(steps, 2);  // steps 2 and 4
  EXPECT_GT(lines, 3);
}

}  // namespace
}  // namespace meshtrain::obs
