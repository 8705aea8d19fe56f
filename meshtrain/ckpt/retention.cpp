// Retention: pick the steps to drop, then drop them one directory at a time.
#include "meshtrain/ckpt/retention.h"

#include <algorithm>
#include <filesystem>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::ckpt {

namespace fs = std::filesystem;

std::vector<int64_t> steps_to_delete(const std::vector<int64_t>& complete_steps,
                                     std::optional<int64_t> latest_step,
                                     const RetentionPolicy& policy,
                                     std::optional<int64_t> best_step) {
  MT_CHECK(policy.keep_last >= 0 && policy.keep_every >= 0, "negative retention setting");
  std::vector<int64_t> steps = complete_steps;
  std::sort(steps.begin(), steps.end());
  steps.erase(std::unique(steps.begin(), steps.end()), steps.end());
  std::vector<int64_t> out;
  if (policy.keep_last == 0) return out;
  const size_t n = steps.size();
  const size_t keep_from =
      n > static_cast<size_t>(policy.keep_last) ? n - static_cast<size_t>(policy.keep_last) : 0;
  for (size_t i = 0; i < keep_from; ++i) {
    const int64_t s = steps[i];
    if (latest_step && *latest_step == s) continue;
    if (best_step && *best_step == s) continue;  // the best stays whatever its age
    if (policy.keep_every > 0 && s % policy.keep_every == 0) continue;
    out.push_back(s);
  }
  return out;
}

std::vector<int64_t> apply_retention(const std::string& root, const RetentionPolicy& policy,
                                     int64_t committed_step) {
  for (const std::string& dir : list_tmp_dirs(root)) {
    std::string name = fs::path(dir).filename().string();
    auto dot = name.find('.');
    auto step = parse_step_dir_name(name.substr(0, dot));
    if (step && *step < committed_step) {
      try {
        remove_dir_safely(dir);
      } catch (const Error& e) {
        MT_LOG_WARN("ckpt", "retention: ", e.what());
      }
    }
  }
  std::optional<int64_t> latest_step;
  if (auto latest = read_latest(root)) latest_step = parse_step_dir_name(*latest);
  if (!latest_step) return {};  // without a readable `latest`, nothing is safe to drop
  // Read after the commit that may have moved it: a save that became the best is protected by
  // the pointer it has just written, and the previous best by the pointer until it moved.
  const std::optional<int64_t> best_step = read_pointer_step(root, kBestFile);
  std::vector<int64_t> doomed =
      steps_to_delete(list_complete_steps(root), latest_step, policy, best_step);
  for (int64_t s : doomed) {
    remove_dir_safely((fs::path(root) / step_dir_name(s)).string());
    MT_LOG_INFO("ckpt", "retention: removed ", step_dir_name(s));
  }
  return doomed;
}

}  // namespace meshtrain::ckpt
