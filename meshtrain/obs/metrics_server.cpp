// See metrics_server.h. Connections, deadlines and socket options are those of every scrape
// endpoint: scrape_http_server.h.
#include "meshtrain/obs/metrics_server.h"

#include <cstdlib>

#include "meshtrain/comm/tls.h"
#include "meshtrain/obs/process_metrics.h"
#include "meshtrain/obs/scrape_http_server.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::obs {

std::optional<MetricsServerOptions> metrics_server_options_from_env(int local_rank) {
  const auto port_text = env_value(Env::metrics_port);
  if (!port_text) return std::nullopt;
  const char* port = port_text->c_str();
  MetricsServerOptions o;
  char* end = nullptr;
  const long base = std::strtol(port, &end, 10);
  if (*end != '\0' || base < 0 || base > 65535)
    MT_THROW(ValueError, "MESHTRAIN_METRICS_PORT must be a port number, got '", port, "'");
  o.port = base == 0 ? 0 : static_cast<int>(base + local_rank);
  if (o.port > 65535)
    MT_THROW(ValueError, "MESHTRAIN_METRICS_PORT + LOCAL_RANK = ", o.port, " is not a port");
  if (auto host = env_value(Env::metrics_host)) o.host = *host;
  if (auto fb = env_value(Env::metrics_port_fallback))
    o.fallback_to_ephemeral = *fb == "1" || *fb == "true";
  o.tls = comm::default_tls();
  return o;
}

struct MetricsServer::Impl {
  MetricsServerOptions options;
  ScrapeHttpServer server;
  int port = 0;

  Impl(Registry& registry, MetricsServerOptions o)
      : options(std::move(o)),
        server(
            [&registry](const std::string& method, const std::string& path) {
              if (method != "GET" || path != "/metrics")
                return HttpReply{404, "text/plain",
                                 "not found: " + path + " (this endpoint serves GET /metrics)\n"};
              update_process_metrics(registry);
              return HttpReply{200, "text/plain; version=0.0.4; charset=utf-8", registry.render()};
            },
            ScrapeHttpServerOptions{.tls = options.tls}) {}
};

MetricsServer::MetricsServer(Registry& registry, MetricsServerOptions options)
    : impl_(std::make_unique<Impl>(registry, std::move(options))) {
  Impl& m = *impl_;
  MT_CHECK(m.options.port >= 0 && m.options.port <= 65535, "metrics port out of range");
  m.port = m.server.bind(m.options.host, m.options.port);
  if (m.port < 0 && m.options.port != 0 && m.options.fallback_to_ephemeral) {
    MT_LOG_WARN("metrics", "port ", m.options.port, " on ", m.options.host,
                " is not available; serving /metrics on a free port instead");
    m.port = m.server.bind(m.options.host, 0);
  }
  if (m.port < 0) {
    MT_THROW(IoError, "metrics endpoint: cannot listen on ", m.options.host, ":",
             m.options.port == 0 ? std::string("<any port>") : std::to_string(m.options.port),
             m.options.port == 0 ? std::string()
                                 : " (port " + std::to_string(m.options.port) +
                                       " is already in use or not permitted)",
             "; set MESHTRAIN_METRICS_PORT to a free port, or "
             "MESHTRAIN_METRICS_PORT_FALLBACK=1 to use any free port");
  }
  m.server.start();
}

MetricsServer::~MetricsServer() {
  stop();
}

void MetricsServer::stop() {
  if (impl_) impl_->server.stop();
}

int MetricsServer::port() const {
  return impl_->port;
}

const std::string& MetricsServer::host() const {
  return impl_->options.host;
}

std::string MetricsServer::url() const {
  return (impl_->options.tls ? "https://" : "http://") + impl_->options.host + ":" +
         std::to_string(impl_->port) + "/metrics";
}

}  // namespace meshtrain::obs
