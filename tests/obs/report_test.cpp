// `meshtrain report`: a page drawn from a synthetic run directory has an SVG with drawn content
// for every plot, tolerates a live run's half-written last line, and renders to a non-blank
// screenshot in headless Chromium when Chromium is installed.
#include "meshtrain/obs/report.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "meshtrain/util/error.h"
#include "tests/support/capability.h"

namespace meshtrain::obs {
namespace {

namespace fs = std::filesystem;

fs::path synthetic_run(const std::string& name, int steps) {
  auto dir = fs::temp_directory_path() / ("mt_report_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream m(dir / "metrics.jsonl");
  m << R"({"step":0,"val_loss":5.6})"
    << "\n";
  for (int s = 1; s <= steps; ++s) {
    const double loss = 5.5 * std::exp(-0.01 * s) + 0.05 * std::sin(s);
    m << nlohmann::json{{"step", s},
                        {"loss", loss},
                        {"lr", 1e-3},
                        {"grad_norm", 1.0},
                        {"step_s", 0.1 + 0.01 * (s % 7)},
                        {"tokens_per_s", 5000 + 10 * s},
                        {"skipped", false},
                        {"data_s", 0.01},
                        {"forward_s", 0.03},
                        {"backward_s", 0.05},
                        {"comm_s", 0.005 * (s % 3)},
                        {"optimizer_s", 0.01}}
             .dump()
      << "\n";
    if (s % 50 == 0) {
      m << nlohmann::json{{"step", s}, {"val_loss", loss + 0.1}}.dump() << "\n";
      m << nlohmann::json{{"event", "checkpoint"},
                          {"step", s},
                          {"duration_s", 0.4},
                          {"bytes", 1 << 20},
                          {"ok", s != 100}}
               .dump()
        << "\n";
      // A resume line (written after the first step of a resumed attempt) is not a step row.
      if (s == 150)
        m << nlohmann::json{{"event", "resume"}, {"step", 100}, {"recover_s", 3.5}, {"resumes", 1}}
                 .dump()
          << "\n";
    }
  }
  m << R"({"step":)" << steps + 1 << R"(,"loss":3.)";  // a live run mid-write: no newline
  m.close();
  for (int r = 0; r < 2; ++r) {
    std::ofstream rf(dir / ("metrics_rank" + std::to_string(r) + ".jsonl"));
    for (int s = 1; s <= steps; ++s)
      rf << nlohmann::json{{"step", s}, {"rank", r}, {"step_s", 0.1 + 0.05 * r}}.dump() << "\n";
  }
  return dir;
}

// The <svg id="..."> element's text.
std::string svg_by_id(const std::string& html, const std::string& id) {
  const auto start = html.find("<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" + id + "\"");
  if (start == std::string::npos) return "";
  const auto end = html.find("</svg>", start);
  return html.substr(start, end - start);
}

size_t count(const std::string& s, const std::string& what) {
  size_t n = 0;
  for (size_t p = s.find(what); p != std::string::npos; p = s.find(what, p + 1)) ++n;
  return n;
}

TEST(ReportTest, EveryPlotHasDrawnContent) {
  const auto dir = synthetic_run("plots", 200);
  const RunHistory h = read_run_history(dir);
  EXPECT_EQ(h.steps.size(), 1u + 200u + 4u);
  EXPECT_EQ(h.skipped_lines, 1);  // the half-written line
  EXPECT_EQ(h.checkpoints.size(), 4u);
  EXPECT_FALSE(h.checkpoints[1].ok);
  EXPECT_EQ(h.rank_step_s.size(), 2u);

  const auto out = write_report(dir);
  std::ifstream in(out);
  const std::string html((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Self-contained: nothing fetched (the only URL is the SVG namespace, which is a name).
  for (const char* fetch : {"src=", "href=", "<link", "@import", "url("})
    EXPECT_EQ(html.find(fetch), std::string::npos) << fetch;
  EXPECT_EQ(html.find("<script"), std::string::npos);

  const std::string loss = svg_by_id(html, "plot-loss");
  EXPECT_NE(loss.find("data-series=\"loss\""), std::string::npos);
  EXPECT_NE(loss.find("data-series=\"val_loss\""), std::string::npos);
  EXPECT_EQ(count(loss, "class=\"marker\""), 4u);  // checkpoint events
  const std::string tput = svg_by_id(html, "plot-throughput");
  EXPECT_NE(tput.find("data-series=\"tokens/s\""), std::string::npos);
  const std::string bd = svg_by_id(html, "plot-breakdown");
  for (const char* p : {"data", "forward", "backward", "comm", "optimizer"})
    EXPECT_NE(bd.find("class=\"area\" data-series=\"" + std::string(p) + "\""), std::string::npos)
        << p;
  const std::string ranks = svg_by_id(html, "plot-ranks");
  EXPECT_NE(ranks.find("data-series=\"rank 0\""), std::string::npos);
  EXPECT_NE(ranks.find("data-series=\"rank 1\""), std::string::npos);
  EXPECT_FALSE(svg_by_id(html, "plot-checkpoints").empty());
  EXPECT_NE(html.find("failure"), std::string::npos);

  // Every polyline has many distinct points inside the drawing area.
  std::regex pts_re("points=\"([^\"]*)\"");
  size_t polylines = 0;
  for (std::sregex_iterator it(html.begin(), html.end(), pts_re), end; it != end; ++it) {
    ++polylines;
    std::istringstream ps((*it)[1].str());
    std::string pair;
    std::set<std::string> distinct;
    while (ps >> pair) {
      const auto comma = pair.find(',');
      ASSERT_NE(comma, std::string::npos);
      const double x = std::stod(pair.substr(0, comma)), y = std::stod(pair.substr(comma + 1));
      EXPECT_TRUE(x >= 0 && x <= 920 && y >= 0 && y <= 300) << pair;
      distinct.insert(pair);
    }
    EXPECT_GE(distinct.size(), 2u);
  }
  EXPECT_GE(polylines, 6u);
  fs::remove_all(dir);
}

TEST(ReportTest, MissingRunDirectoryIsAClearError) {
  try {
    read_run_history("/nonexistent/run");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("metrics.jsonl"), std::string::npos);
  }
}

// Counts the non-white pixels of an 8-bit RGB/RGBA PNG (the format Chromium writes) with the
// system Python's zlib, to check that the page is not blank.
const char* kPngCounter = R"PY(
import struct, sys, zlib
data = open(sys.argv[1], 'rb').read()
assert data[:8] == b'\x89PNG\r\n\x1a\n'
pos, idat, w, h, ctype = 8, b'', 0, 0, 0
while pos < len(data):
    n, kind = struct.unpack('>I4s', data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b'IHDR':
        w, h, depth, ctype = struct.unpack('>IIBB', body[:10])
        assert depth == 8 and ctype in (2, 6)
    elif kind == b'IDAT':
        idat += body
    pos += 12 + n
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colored = 0
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    for x in range(0, stride, bpp):
        if min(line[x], line[x + 1], line[x + 2]) < 200: colored += 1
    prev = line
print(w, h, colored)
)PY";

TEST(ReportTest, RendersNonBlankInHeadlessChromium) {
  const char* chromium = "/usr/bin/chromium";
  MT_SKIP_UNLESS("chromium", ::access(chromium, X_OK) == 0, "chromium not installed");
  MT_SKIP_UNLESS("python", ::access("/usr/bin/python3", X_OK) == 0,
                 "/usr/bin/python3 not installed");
  const auto dir = synthetic_run("chromium", 300);
  const auto page = write_report(dir);
  const auto shot = dir / "shot.png";
  const auto profile = dir / "profile";
  const std::string cmd =
      std::string("timeout 60 ") + chromium +
      " --headless --no-sandbox --disable-gpu --disable-background-networking"
      " --disable-component-update --disable-sync --no-first-run --user-data-dir=" +
      profile.string() + " --screenshot=" + shot.string() + " --window-size=900,1500 file://" +
      fs::absolute(page).string() + " > " + (dir / "chromium.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "chromium failed; see " << dir / "chromium.log";
  ASSERT_TRUE(fs::exists(shot));
  EXPECT_GT(fs::file_size(shot), 20'000u);
  std::ofstream(dir / "count.py") << kPngCounter;
  const std::string count_cmd = "/usr/bin/python3 " + (dir / "count.py").string() + " " +
                                shot.string() + " > " + (dir / "count.txt").string();
  ASSERT_EQ(std::system(count_cmd.c_str()), 0);
  std::ifstream in(dir / "count.txt");
  long w = 0, h = 0, colored = 0;
  in >> w >> h >> colored;
  EXPECT_EQ(w, 900);
  EXPECT_EQ(h, 1500);
  // Lines, areas and text: well over 1% of the page is ink.
  EXPECT_GT(colored, w * h / 100) << "screenshot looks blank";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain::obs
