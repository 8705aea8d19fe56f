// Serves a Registry as `GET /metrics` (Prometheus text format) from a background thread, so that
// a Prometheus server can scrape each worker. The endpoint is read-only: it answers GET /metrics
// and nothing else, and binds only where it is told (127.0.0.1 unless configured otherwise; set
// MESHTRAIN_METRICS_HOST=0.0.0.0 where a scraper on another host must reach it).
//
// A taken port is an IoError naming the address and port, or, with `fallback_to_ephemeral`, a
// warning and a free port chosen by the kernel. The caller (the trainer) treats a failure to start
// as a warning: metrics are an aid, never a reason to stop training.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "meshtrain/obs/metrics.h"

namespace meshtrain::comm {
class TlsContext;
}

namespace meshtrain::obs {

struct MetricsServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0 = any free port
  bool fallback_to_ephemeral = false;
  // HTTPS with the job's certificates (the process's TLS, comm::default_tls()); null: HTTP.
  std::shared_ptr<const comm::TlsContext> tls = nullptr;
};

// From MESHTRAIN_METRICS_PORT (+ `local_rank`, the launcher's LOCAL_RANK, so that the ranks of
// one node do not collide), MESHTRAIN_METRICS_HOST and MESHTRAIN_METRICS_PORT_FALLBACK=1;
// nullopt when the port is unset.
std::optional<MetricsServerOptions> metrics_server_options_from_env(int local_rank);

class MetricsServer {
 public:
  // Binds and starts serving before returning; throws IoError when it cannot bind.
  MetricsServer(Registry& registry, MetricsServerOptions options);
  ~MetricsServer();  // stops accepting, finishes in-flight requests, joins the thread
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  int port() const;
  const std::string& host() const;
  std::string url() const;  // "http://127.0.0.1:9400/metrics"
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace meshtrain::obs
