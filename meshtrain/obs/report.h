// `meshtrain report RUN_DIR`: reads the metrics history a run writes (metrics.jsonl from rank 0,
// metrics_rank<R>.jsonl from every rank of a multi-rank job) and draws one self-contained HTML
// page: loss and validation loss, tokens/s, the step-time breakdown, per-rank step times and
// checkpoint events. It works on a live run: a last line still being written is skipped.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::obs {

struct StepRow {
  int64_t step = 0;
  std::optional<double> loss, val_loss, lr, grad_norm, step_s, tokens_per_s;
  std::optional<double> data_s, forward_s, backward_s, comm_s, optimizer_s;
  bool skipped = false;
};

struct CheckpointEvent {
  int64_t step = 0;
  double duration_s = 0;
  int64_t bytes = 0;
  bool ok = true;
};

struct RunHistory {
  std::vector<StepRow> steps;  // from metrics.jsonl, in file order
  std::vector<CheckpointEvent> checkpoints;
  std::map<int, std::vector<std::pair<int64_t, double>>> rank_step_s;  // rank -> (step, step_s)
  int64_t skipped_lines = 0;  // malformed or truncated lines
};

// Throws IoError when the directory has no metrics.jsonl.
RunHistory read_run_history(const std::filesystem::path& run_dir);
std::string render_report_html(const RunHistory& history, const std::string& title);
// Reads `run_dir` and writes the page to `out` (default RUN_DIR/report.html); returns the path.
std::filesystem::path write_report(const std::filesystem::path& run_dir,
                                   const std::filesystem::path& out = {});

}  // namespace meshtrain::obs
