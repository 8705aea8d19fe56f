// See metrics_aggregator.h.
#include "meshtrain/obs/metrics_aggregator.h"

#include <chrono>
#include <map>
#include <optional>

#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/tls.h"
#include "meshtrain/obs/scrape_http_server.h"
#include "meshtrain/util/error.h"

namespace meshtrain::obs {

namespace {

struct Family {
  std::string help;
  std::string type;
  std::vector<std::string> samples;
};

// The family a sample line belongs to: its metric name, less the histogram/summary suffix when
// such a family was declared.
std::string family_of(const std::string& name, const std::map<std::string, Family>& families) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string s(suffix);
    if (name.size() > s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0) {
      const std::string base = name.substr(0, name.size() - s.size());
      if (families.count(base)) return base;
    }
  }
  return name;
}

// GET /metrics of host:port (over TLS with `tls`): the body of a 200 reply, else nothing. The
// workers' endpoints answer one request per connection and close it after the reply.
std::optional<std::string> fetch_metrics(const std::string& host, int port,
                                         const comm::TlsContext* tls,
                                         std::chrono::milliseconds timeout) {
  try {
    const comm::Deadline deadline(timeout);
    comm::Socket s =
        comm::Socket::connect(host, static_cast<uint16_t>(port), deadline, /*retry=*/false);
    if (tls != nullptr)
      s.start_tls(*tls, /*server=*/false, deadline, /*server_speaks_first=*/false);
    const std::string request =
        "GET /metrics HTTP/1.1\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
    s.send_all(request.data(), request.size(), deadline);
    std::string reply;
    char buf[16384];
    while (const size_t n = s.recv_some(buf, sizeof(buf), deadline)) reply.append(buf, n);
    const size_t body = reply.find("\r\n\r\n");
    if (body == std::string::npos || reply.compare(0, 12, "HTTP/1.1 200") != 0) return std::nullopt;
    return reply.substr(body + 4);
  } catch (const Error&) {
    return std::nullopt;  // not up yet, gone, or refused: the target is down
  }
}

}  // namespace

std::string merge_expositions(const std::vector<std::string>& texts) {
  std::map<std::string, Family> families;
  std::vector<std::string> order;
  auto family = [&](const std::string& name) -> Family& {
    auto [it, inserted] = families.try_emplace(name);
    if (inserted) order.push_back(name);
    return it->second;
  };
  for (const std::string& text : texts) {
    size_t pos = 0;
    while (pos < text.size()) {
      size_t end = text.find('\n', pos);
      if (end == std::string::npos) end = text.size();
      const std::string line = text.substr(pos, end - pos);
      pos = end + 1;
      if (line.empty()) continue;
      if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
        const size_t name_end = line.find(' ', 7);
        const std::string name = line.substr(7, name_end - 7);
        Family& f = family(name);
        std::string& slot = line[2] == 'H' ? f.help : f.type;
        if (slot.empty()) slot = line;
        continue;
      }
      if (line[0] == '#') continue;
      const size_t name_end = line.find_first_of("{ ");
      family(family_of(line.substr(0, name_end), families)).samples.push_back(line);
    }
  }
  std::string out;
  for (const std::string& name : order) {
    const Family& f = families[name];
    if (!f.help.empty()) out += f.help + "\n";
    if (!f.type.empty()) out += f.type + "\n";
    for (const std::string& s : f.samples) out += s + "\n";
  }
  return out;
}

struct MetricsAggregator::Impl {
  MetricsAggregatorOptions options;
  std::unique_ptr<ScrapeHttpServer> server;
  int port = 0;
};

std::string MetricsAggregator::collect() const {
  std::vector<std::string> texts;
  std::string up =
      "# HELP meshtrain_aggregator_target_up Whether the worker endpoint answered the last "
      "scrape.\n# TYPE meshtrain_aggregator_target_up gauge\n";
  for (const std::string& target : impl_->options.targets) {
    const size_t colon = target.rfind(':');
    bool ok = false;
    if (colon != std::string::npos) {
      auto body = fetch_metrics(target.substr(0, colon), std::stoi(target.substr(colon + 1)),
                                impl_->options.tls.get(),
                                std::chrono::milliseconds(impl_->options.fetch_timeout_ms));
      if (body) {
        texts.push_back(std::move(*body));
        ok = true;
      }
    }
    up += "meshtrain_aggregator_target_up{target=\"" + target + "\"} " + (ok ? "1" : "0") + "\n";
  }
  texts.push_back(up);
  return merge_expositions(texts);
}

MetricsAggregator::MetricsAggregator(MetricsAggregatorOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  MT_CHECK(m.options.port >= 0 && m.options.port <= 65535, "metrics port out of range");
  m.server = std::make_unique<ScrapeHttpServer>(
      [this](const std::string& method, const std::string& path) {
        if (method != "GET" || path != "/metrics")
          return HttpReply{404, "text/plain",
                           "not found: " + path + " (this endpoint serves GET /metrics)\n"};
        return HttpReply{200, "text/plain; version=0.0.4; charset=utf-8", collect()};
      },
      ScrapeHttpServerOptions{.tls = m.options.tls});
  m.port = m.server->bind(m.options.host, m.options.port);
  if (m.port < 0)
    MT_THROW(IoError, "aggregated metrics endpoint: cannot listen on ", m.options.host, ":",
             m.options.port, " (in use or not permitted); choose another --metrics-port");
  m.server->start();
}

MetricsAggregator::~MetricsAggregator() {
  impl_->server->stop();
}

int MetricsAggregator::port() const {
  return impl_->port;
}

std::string MetricsAggregator::url() const {
  return (impl_->options.tls ? "https://" : "http://") + impl_->options.host + ":" +
         std::to_string(impl_->port) + "/metrics";
}

}  // namespace meshtrain::obs
