// Which checkpoints to keep: the newest K, plus every M-th step as long-term milestones. Only
// complete checkpoints are ever deleted, never the one `latest` names nor the one `best` names
// (ckpt.keep_best: kept apart from keep_last and keep_every), and the decision is a
// pure function (steps_to_delete) so it is tested apart from the filesystem.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace meshtrain::ckpt {

struct RetentionPolicy {
  int64_t keep_last = 0;   // keep the newest K complete checkpoints; 0 keeps everything
  int64_t keep_every = 0;  // also keep steps divisible by M; 0 keeps no milestones
};

// From the complete steps (any order) and the steps `latest` and `best` name: the steps to
// delete. The best step is never deleted: when it is older than the newest K, it is kept
// besides them.
std::vector<int64_t> steps_to_delete(const std::vector<int64_t>& complete_steps,
                                     std::optional<int64_t> latest_step,
                                     const RetentionPolicy& policy,
                                     std::optional<int64_t> best_step = std::nullopt);

// Applies the policy under root and returns the deleted steps. Also removes leftover ".tmp"
// directories of steps before `committed_step` (a crash's remains; later ones may be in the
// middle of being written by other ranks).
std::vector<int64_t> apply_retention(const std::string& root, const RetentionPolicy& policy,
                                     int64_t committed_step);

}  // namespace meshtrain::ckpt
