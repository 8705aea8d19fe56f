// The node-level /metrics endpoint of `meshrun --metrics-port`: one scrape target per node instead
// of one per worker. Each request fetches every local worker's endpoint and merges the texts so
// that each metric family appears once (one HELP and TYPE line, then the samples of every
// worker, which differ by their rank label). Read-only, like the workers' endpoints; a worker
// that does not answer (not started yet, or finished) is left out, and
// meshtrain_aggregator_target_up{target} says which answered.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace meshtrain::comm {
class TlsContext;
}

namespace meshtrain::obs {

// Merges Prometheus text expositions: families in order of first appearance, HELP/TYPE once,
// samples of the same family from every text together.
std::string merge_expositions(const std::vector<std::string>& texts);

struct MetricsAggregatorOptions {
  std::string host = "127.0.0.1";
  int port = 0;                      // 0 = any free port
  std::vector<std::string> targets;  // "host:port" of each worker's endpoint
  int fetch_timeout_ms = 2000;
  // HTTPS both ways (this endpoint, and the workers' it fetches) with the job's certificates;
  // null: HTTP.
  std::shared_ptr<const comm::TlsContext> tls = nullptr;
};

class MetricsAggregator {
 public:
  // Binds and serves before returning; IoError when the port cannot be bound.
  explicit MetricsAggregator(MetricsAggregatorOptions options);
  ~MetricsAggregator();
  MetricsAggregator(const MetricsAggregator&) = delete;
  MetricsAggregator& operator=(const MetricsAggregator&) = delete;

  int port() const;
  std::string url() const;
  // What a scrape returns now.
  std::string collect() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain::obs
