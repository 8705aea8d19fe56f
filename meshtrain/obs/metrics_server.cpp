// See metrics_server.h. The server's pool, timeouts and socket options (SO_REUSEADDR, not
// cpp-httplib's SO_REUSEPORT, so that a live conflict fails to bind) are those of every scrape
// endpoint: scrape_server_settings.h.
#include "meshtrain/obs/metrics_server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "meshtrain/obs/process_metrics.h"
#include "meshtrain/obs/scrape_server_settings.h"
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
  return o;
}

struct MetricsServer::Impl {
  Registry& registry;
  MetricsServerOptions options;
  httplib::Server server;
  std::thread thread;
  int port = 0;
  std::atomic<bool> listen_returned{false};

  explicit Impl(Registry& r, MetricsServerOptions o) : registry(r), options(std::move(o)) {}
};

MetricsServer::MetricsServer(Registry& registry, MetricsServerOptions options)
    : impl_(std::make_unique<Impl>(registry, std::move(options))) {
  Impl& m = *impl_;
  MT_CHECK(m.options.port >= 0 && m.options.port <= 65535, "metrics port out of range");
  const ScrapeServerSettings settings(m.server);
  Registry* reg = &m.registry;
  m.server.Get("/metrics", [reg](const httplib::Request&, httplib::Response& res) {
    update_process_metrics(*reg);
    res.set_content(reg->render(), "text/plain; version=0.0.4; charset=utf-8");
  });
  m.server.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (res.status == 404)
      res.set_content("not found: " + req.path + " (this endpoint serves GET /metrics)\n",
                      "text/plain");
  });

  bool bound = m.options.port == 0 ? (m.port = m.server.bind_to_any_port(m.options.host)) > 0
                                   : m.server.bind_to_port(m.options.host, m.options.port);
  if (bound && m.options.port != 0) m.port = m.options.port;
  if (!bound && m.options.port != 0 && m.options.fallback_to_ephemeral) {
    MT_LOG_WARN("metrics", "port ", m.options.port, " on ", m.options.host,
                " is not available; serving /metrics on a free port instead");
    m.port = m.server.bind_to_any_port(m.options.host);
    bound = m.port > 0;
  }
  if (!bound) {
    MT_THROW(IoError, "metrics endpoint: cannot listen on ", m.options.host, ":",
             m.options.port == 0 ? std::string("<any port>") : std::to_string(m.options.port),
             m.options.port == 0 ? std::string()
                                 : " (port " + std::to_string(m.options.port) +
                                       " is already in use or not permitted)",
             "; set MESHTRAIN_METRICS_PORT to a free port, or "
             "MESHTRAIN_METRICS_PORT_FALLBACK=1 to use any free port");
  }
  settings.widen_backlog();
  m.thread = std::thread([&m] {
    m.server.listen_after_bind();
    m.listen_returned.store(true);
  });
  // stop() only interrupts a server that is running: wait for the accept loop to start so that
  // a destructor right after construction cannot leave the thread blocked in accept().
  while (!m.server.is_running() && !m.listen_returned.load())
    std::this_thread::sleep_for(std::chrono::microseconds(100));
}

MetricsServer::~MetricsServer() {
  stop();
}

void MetricsServer::stop() {
  if (!impl_ || !impl_->thread.joinable()) return;
  impl_->server.stop();
  impl_->thread.join();
}

int MetricsServer::port() const {
  return impl_->port;
}

const std::string& MetricsServer::host() const {
  return impl_->options.host;
}

std::string MetricsServer::url() const {
  return "http://" + impl_->options.host + ":" + std::to_string(impl_->port) + "/metrics";
}

}  // namespace meshtrain::obs
