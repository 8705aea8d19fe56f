// See report.h. The page is plain HTML with inline CSS and inline SVG: it opens from a file, on a
// machine without network access, years later.
#include "meshtrain/obs/report.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>

#include "meshtrain/obs/svg_chart.h"
#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"

namespace meshtrain::obs {
namespace {

std::optional<double> num(const nlohmann::json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number()) return std::nullopt;
  return it->get<double>();
}

// Calls `fn` for every complete, parseable JSON object line; returns how many lines were not.
template <typename Fn>
int64_t for_each_json_line(const std::filesystem::path& path, Fn fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MT_THROW(IoError, "report: cannot read ", path.string());
  std::string line;
  int64_t bad = 0;
  while (std::getline(in, line)) {
    // A line without its newline is still being written by a live run.
    if (in.eof()) {
      if (!line.empty()) ++bad;
      break;
    }
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++bad;
      continue;
    }
    fn(j);
  }
  return bad;
}

double median(std::vector<double> v) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return "&ndash;";
  std::ostringstream os;
  os << std::fixed << std::setprecision(digits) << v;
  return os.str();
}

ChartOptions chart(std::string id, std::string title, std::string x, std::string y) {
  ChartOptions o;
  o.id = std::move(id);
  o.title = std::move(title);
  o.x_label = std::move(x);
  o.y_label = std::move(y);
  return o;
}

const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                          "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

}  // namespace

RunHistory read_run_history(const std::filesystem::path& run_dir) {
  RunHistory h;
  const auto main_file = run_dir / "metrics.jsonl";
  if (!std::filesystem::exists(main_file))
    MT_THROW(IoError, "report: ", main_file.string(),
             " not found; is this the run directory (train.out_dir)?");
  // Rank 0's rows carry every rank's step time (exchanged with the loss), in case the per-rank
  // files are missing (e.g. another node's out_dir).
  decltype(h.rank_step_s) from_rows;
  h.skipped_lines += for_each_json_line(main_file, [&](const nlohmann::json& j) {
    if (j.contains("rank_step_s") && j["rank_step_s"].is_array() && j.contains("step") &&
        j["step"].is_number_integer()) {
      const auto& a = j["rank_step_s"];
      for (size_t rank = 0; rank < a.size(); ++rank)
        if (a[rank].is_number())
          from_rows[static_cast<int>(rank)].emplace_back(j["step"].get<int64_t>(),
                                                         a[rank].get<double>());
    }
    if (j.value("event", "") == "checkpoint") {
      CheckpointEvent e;
      e.step = j.value("step", int64_t{0});
      e.duration_s = j.value("duration_s", 0.0);
      e.bytes = j.value("bytes", int64_t{0});
      e.ok = j.value("ok", true);
      h.checkpoints.push_back(e);
      return;
    }
    if (j.contains("event")) return;  // other events (a resume) are not step rows
    if (!j.contains("step") || !j["step"].is_number_integer()) return;
    StepRow r;
    r.step = j["step"].get<int64_t>();
    r.loss = num(j, "loss");
    r.val_loss = num(j, "val_loss");
    r.lr = num(j, "lr");
    r.grad_norm = num(j, "grad_norm");
    r.step_s = num(j, "step_s");
    r.tokens_per_s = num(j, "tokens_per_s");
    r.data_s = num(j, "data_s");
    r.forward_s = num(j, "forward_s");
    r.backward_s = num(j, "backward_s");
    r.comm_s = num(j, "comm_s");
    r.optimizer_s = num(j, "optimizer_s");
    r.skipped = j.value("skipped", false);
    h.steps.push_back(r);
  });
  static const std::regex kRankFile(R"(metrics_rank(\d+)\.jsonl)");
  for (const auto& entry : std::filesystem::directory_iterator(run_dir)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!std::regex_match(name, m, kRankFile)) continue;
    const int rank = std::stoi(m[1].str());
    auto& series = h.rank_step_s[rank];
    h.skipped_lines += for_each_json_line(entry.path(), [&](const nlohmann::json& j) {
      auto s = num(j, "step_s");
      if (s && j.contains("step") && j["step"].is_number_integer())
        series.emplace_back(j["step"].get<int64_t>(), *s);
    });
  }
  if (h.rank_step_s.empty()) h.rank_step_s = std::move(from_rows);
  if (h.rank_step_s.empty()) {
    // A one-rank run: rank 0's own history is the per-rank view.
    for (const auto& r : h.steps)
      if (r.step_s) h.rank_step_s[0].emplace_back(r.step, *r.step_s);
  }
  return h;
}

std::string render_report_html(const RunHistory& h, const std::string& title) {
  std::vector<std::pair<double, std::string>> ckpt_markers;
  for (const auto& c : h.checkpoints)
    ckpt_markers.emplace_back(
        static_cast<double>(c.step),
        "checkpoint at step " + std::to_string(c.step) + (c.ok ? "" : " (failed)"));

  ChartSeries loss{"loss", kPalette[0], {}}, val{"val_loss", kPalette[1], {}};
  ChartSeries tok{"tokens/s", kPalette[2], {}};
  const char* phase_names[] = {"data", "forward", "backward", "comm", "optimizer"};
  std::vector<ChartSeries> phases;
  for (size_t i = 0; i < 5; ++i) phases.push_back({phase_names[i], kPalette[i], {}});
  std::vector<double> tok_values, step_values;
  std::array<double, 5> phase_sum{};
  int64_t skipped = 0, last_step = 0;
  for (const auto& r : h.steps) {
    const double x = static_cast<double>(r.step);
    last_step = std::max(last_step, r.step);
    if (r.loss) loss.points.emplace_back(x, *r.loss);
    if (r.val_loss) val.points.emplace_back(x, *r.val_loss);
    if (r.tokens_per_s) {
      tok.points.emplace_back(x, *r.tokens_per_s);
      tok_values.push_back(*r.tokens_per_s);
    }
    if (r.step_s) step_values.push_back(*r.step_s);
    if (r.skipped) ++skipped;
    if (r.data_s && r.forward_s && r.backward_s && r.optimizer_s) {
      const double v[5] = {*r.data_s, *r.forward_s, *r.backward_s, r.comm_s.value_or(0.0),
                           *r.optimizer_s};
      for (size_t i = 0; i < 5; ++i) {
        phases[i].points.emplace_back(x, v[i]);
        phase_sum[i] += v[i];
      }
    }
  }
  std::vector<ChartSeries> ranks;
  for (const auto& [rank, pts] : h.rank_step_s) {
    ChartSeries s{"rank " + std::to_string(rank), kPalette[static_cast<size_t>(rank) % 10], {}};
    for (const auto& [step, sec] : pts) s.points.emplace_back(static_cast<double>(step), sec);
    ranks.push_back(std::move(s));
  }

  std::ostringstream os;
  os << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>"
     << html_escape(title) << "</title>\n<style>\n"
     << "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;"
        "max-width:960px;color:#222;background:#fafafa}\n"
     << "h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:28px 0 6px}"
        ".sub{color:#666;font-size:13px}\n"
     << "table{border-collapse:collapse;font-size:13px;margin:8px 0}"
        "td,th{border:1px solid #ddd;padding:4px 10px;text-align:right}"
        "th{background:#f0f0f0}\n"
     << "svg.chart{display:block;border:1px solid #ddd;border-radius:4px;margin:6px 0}\n"
     << "svg .title{font-size:14px;font-weight:600}svg .tick{font-size:11px;fill:#555}"
        "svg .axis{font-size:12px;fill:#333}\n"
     << "svg .grid{stroke:#eee;stroke-width:1}svg .frame{fill:none;stroke:#999}"
        "svg .marker{stroke:#d62728;stroke-dasharray:4 3;stroke-width:1.2}\n"
     << ".note{color:#666;font-size:13px;font-style:italic}\n</style></head><body>\n";
  os << "<h1>" << html_escape(title) << "</h1>\n<div class=\"sub\">" << h.steps.size()
     << " rows, last step " << last_step;
  if (h.skipped_lines > 0) os << "; " << h.skipped_lines << " incomplete line(s) skipped";
  os << "</div>\n";

  // Summary table.
  double final_loss = NAN, final_val = NAN;
  for (const auto& r : h.steps) {
    if (r.loss) final_loss = *r.loss;
    if (r.val_loss) final_val = *r.val_loss;
  }
  double phase_total = 0;
  for (double v : phase_sum) phase_total += v;
  os << "<table id=\"summary\"><tr><th>last step</th><th>loss</th><th>val loss</th>"
        "<th>median tokens/s</th><th>median step (s)</th><th>skipped steps</th>"
        "<th>checkpoints</th></tr><tr><td>"
     << last_step << "</td><td>" << fixed(final_loss, 4) << "</td><td>" << fixed(final_val, 4)
     << "</td><td>" << fixed(median(tok_values), 0) << "</td><td>" << fixed(median(step_values), 4)
     << "</td><td>" << skipped << "</td><td>" << h.checkpoints.size() << "</td></tr></table>\n";
  if (phase_total > 0) {
    os << "<table id=\"breakdown-share\"><tr>";
    for (const char* n : phase_names) os << "<th>" << n << "</th>";
    os << "</tr><tr>";
    for (double v : phase_sum) os << "<td>" << fixed(100.0 * v / phase_total, 1) << "%</td>";
    os << "</tr></table>\n";
  }

  os << "<h2>Loss</h2>\n";
  ChartOptions lo = chart("plot-loss", "Training and validation loss", "step", "loss");
  lo.markers = ckpt_markers;
  os << line_chart_svg({loss, val}, lo);

  os << "<h2>Throughput</h2>\n";
  ChartOptions to = chart("plot-throughput", "Tokens per second (all ranks)", "step", "tokens/s");
  to.y_from_zero = true;
  os << line_chart_svg({tok}, to);

  os << "<h2>Step-time breakdown</h2>\n";
  ChartOptions bo = chart("plot-breakdown", "Time per step by phase (comm = exposed communication)",
                          "step", "seconds");
  if (phases[0].points.empty())
    os << "<p class=\"note\">No per-phase timings in this run's metrics.</p>\n";
  os << stacked_area_svg(phases, bo);

  os << "<h2>Per-rank step times</h2>\n";
  ChartOptions ro = chart("plot-ranks", "Step time by rank", "step", "seconds");
  ro.y_from_zero = true;
  os << line_chart_svg(ranks, ro);

  os << "<h2>Checkpoints</h2>\n";
  if (h.checkpoints.empty()) {
    os << "<p class=\"note\" id=\"no-checkpoints\">No checkpoint events recorded.</p>\n";
  } else {
    ChartSeries cs{"duration (s)", kPalette[3], {}};
    for (const auto& c : h.checkpoints)
      cs.points.emplace_back(static_cast<double>(c.step), c.duration_s);
    ChartOptions co = chart("plot-checkpoints", "Checkpoint write time", "step", "seconds");
    co.y_from_zero = true;
    co.height = 220;
    co.markers = ckpt_markers;
    os << line_chart_svg({cs}, co);
    os << "<table id=\"checkpoints\"><tr><th>step</th><th>duration (s)</th><th>MB</th>"
          "<th>outcome</th></tr>\n";
    for (const auto& c : h.checkpoints)
      os << "<tr><td>" << c.step << "</td><td>" << fixed(c.duration_s, 3) << "</td><td>"
         << fixed(static_cast<double>(c.bytes) / 1e6, 2) << "</td><td>"
         << (c.ok ? "success" : "failure") << "</td></tr>\n";
    os << "</table>\n";
  }
  os << "</body></html>\n";
  return os.str();
}

std::filesystem::path write_report(const std::filesystem::path& run_dir,
                                   const std::filesystem::path& out) {
  const RunHistory h = read_run_history(run_dir);
  const auto path = out.empty() ? run_dir / "report.html" : out;
  std::string title = "meshtrain run: " + std::filesystem::absolute(run_dir).filename().string();
  write_file_atomic(path.string(), render_report_html(h, title));
  return path;
}

}  // namespace meshtrain::obs
