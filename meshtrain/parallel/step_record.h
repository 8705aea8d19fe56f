// What every rank tells every other at the end of a step, in one small all-gather instead of a
// loss all-reduce: its loss, its own compute time (before waiting for the others, for the
// straggler view), its stop request and its save request (rank 0's decides). Summing the losses
// in rank order gives every rank the same bits of the mean, so every rank takes the same
// decisions from it. Used by the data-parallel and the pipeline steps alike.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "meshtrain/parallel/engine.h"

namespace meshtrain::parallel {

struct StepRecord {
  static constexpr size_t kFloats = 4;

  StepRecord(float loss, double compute_s, bool stop, bool save)
      : mine{loss, static_cast<float>(compute_s), stop ? 1.0f : 0.0f, save ? 1.0f : 0.0f} {}

  // Reads the gathered records of `world` ranks (kFloats each, in rank order): fills
  // out.rank_step_s, out.stop (any rank's request) and out.save (rank 0's), returns the mean loss.
  static float combine(const std::vector<float>& all, int world, StepOutcome& out) {
    double sum = 0;
    for (int r = 0; r < world; ++r) {
      const float* e = all.data() + kFloats * static_cast<size_t>(r);
      sum += e[0];
      out.rank_step_s.push_back(e[1]);
      out.stop = out.stop || e[2] > 0.0f;
    }
    out.save = all[3] > 0.0f;
    return static_cast<float>(sum / world);
  }

  std::array<float, kFloats> mine;
};

}  // namespace meshtrain::parallel
