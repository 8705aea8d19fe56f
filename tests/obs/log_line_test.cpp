// Log lines: human lines carry time, rank and step; JSON lines parse and carry the same plus the
// structured fields; an unknown format is rejected. Also the report's per-rank view from the
// step times that rank 0's metrics rows carry.
#include "meshtrain/obs/log_line.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "meshtrain/obs/report.h"
#include "meshtrain/util/error.h"

namespace meshtrain::obs {
namespace {

TEST(LogLineTest, TextLineStartsWithTimeRankAndStep) {
  const std::string line = format_log_line(LogFormat::kText, 3, 42, "loss 1.5");
  EXPECT_TRUE(std::regex_match(
      line, std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} rank 3 step 42 \| loss 1\.5)")))
      << line;
  const std::string outside = format_log_line(LogFormat::kText, 0, -1, "starting");
  EXPECT_EQ(outside.find("step"), std::string::npos) << outside;
}

TEST(LogLineTest, JsonLineHasTimeRankStepMessageAndFields) {
  const std::string line =
      format_log_line(LogFormat::kJson, 1, 7, "step 7/10", {{"loss", 2.5}, {"step", 999}});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["rank"], 1);
  EXPECT_EQ(j["step"], 7);  // the field does not override the line's own step
  EXPECT_EQ(j["msg"], "step 7/10");
  EXPECT_EQ(j["loss"], 2.5);
  EXPECT_TRUE(j["time"].is_string());
  // Bytes that are not UTF-8 (sampled text) do not break the line.
  EXPECT_NO_THROW(nlohmann::json::parse(format_log_line(LogFormat::kJson, 0, -1, "\xff\xfe")));
}

TEST(LogLineTest, UnknownFormatIsRejected) {
  EXPECT_EQ(parse_log_format("json"), LogFormat::kJson);
  EXPECT_EQ(parse_log_format("text"), LogFormat::kText);
  EXPECT_THROW(parse_log_format("xml"), ValueError);
}

TEST(ReportRankStepTimesTest, PerRankViewComesFromRankZeroRowsWithoutRankFiles) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("mt_rankrows_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  {
    std::ofstream m(dir / "metrics.jsonl");
    for (int s = 1; s <= 3; ++s)
      m << nlohmann::json{{"step", s},
                          {"loss", 3.0},
                          {"step_s", 0.2},
                          {"rank_step_s", {0.1, 0.2 * s}}}
               .dump()
        << "\n";
  }
  const RunHistory h = read_run_history(dir);
  ASSERT_EQ(h.rank_step_s.size(), 2u);
  ASSERT_EQ(h.rank_step_s.at(1).size(), 3u);
  EXPECT_DOUBLE_EQ(h.rank_step_s.at(1)[2].second, 0.6);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain::obs
