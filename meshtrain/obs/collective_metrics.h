// Collective count, bytes and latency by operation, for whoever runs collectives above the comm
// layer (the DDP reducer, ZeRO) or a comm-layer observer: comm sits below obs and must not
// include it, so it reports through a callback that the runtime connects to record().
//
//   meshtrain_collectives_total{op}              counter
//   meshtrain_collective_bytes_total{op}         counter  payload bytes this rank contributed
//   meshtrain_collective_duration_seconds{op}    histogram
//   meshtrain_collective_failures_total{op}      counter
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/obs/metrics.h"

namespace meshtrain::obs {

class CollectiveMetrics {
 public:
  explicit CollectiveMetrics(Registry& registry) : registry_(registry) {}

  struct OpMetrics {
    Counter* count;
    Counter* bytes;
    Histogram* duration;
    Counter* failures;
  };
  // The metrics of one operation; keep the result to skip the lookup on later calls.
  OpMetrics& op(std::string_view name);
  void record(std::string_view op_name, int64_t bytes, double seconds, bool ok = true);

 private:
  Registry& registry_;
  std::mutex mu_;
  std::vector<std::pair<std::string, std::unique_ptr<OpMetrics>>> ops_;
};

}  // namespace meshtrain::obs
