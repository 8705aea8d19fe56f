// What the Prometheus tests share: a free loopback port, a Prometheus server started on a given
// scrape configuration (killed and cleaned up when the object goes), and instant PromQL queries.
#pragma once

#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

extern char** environ;

namespace meshtrain::obs::testing {

inline constexpr const char* kPrometheus = "/usr/bin/prometheus";

inline bool prometheus_available() {
  return ::access(kPrometheus, X_OK) == 0;
}

inline int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// True when `port` on loopback can be bound right now.
inline bool port_free(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  ::close(fd);
  return ok;
}

// The `result` array of an instant query, or an empty array.
inline nlohmann::json query(httplib::Client& cli, const std::string& promql) {
  auto res = cli.Get("/api/v1/query", httplib::Params{{"query", promql}}, httplib::Headers{});
  if (!res || res->status != 200) return nlohmann::json::array();
  auto j = nlohmann::json::parse(res->body, nullptr, false);
  if (j.is_discarded() || j.value("status", "") != "success") return nlohmann::json::array();
  return j["data"]["result"];
}

// A Prometheus server scraping `targets` ("host:port") every second, honouring our labels, and
// evaluating `rule_files` every second.
class PrometheusServer {
 public:
  PrometheusServer(const std::filesystem::path& dir, const std::vector<std::string>& targets,
                   const std::vector<std::filesystem::path>& rule_files = {})
      : dir_(dir), port_(free_port()) {
    std::filesystem::create_directories(dir_);
    {
      std::ofstream cfg(dir_ / "prometheus.yml");
      cfg << "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n";
      if (!rule_files.empty()) {
        cfg << "rule_files:\n";
        for (const auto& f : rule_files) cfg << "  - '" << f.string() << "'\n";
      }
      cfg << "scrape_configs:\n  - job_name: meshtrain\n    honor_labels: true\n"
          << "    static_configs:\n      - targets: [";
      for (size_t i = 0; i < targets.size(); ++i) cfg << (i ? ", '" : "'") << targets[i] << "'";
      cfg << "]\n";
    }
    std::vector<std::string> argv_s{
        kPrometheus, "--config.file=" + (dir_ / "prometheus.yml").string(),
        "--storage.tsdb.path=" + (dir_ / "data").string(),
        "--web.listen-address=127.0.0.1:" + std::to_string(port_), "--log.level=warn"};
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    log_ = (dir_ / "prometheus.log").string();
    posix_spawn_file_actions_addopen(&fa, 1, log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    if (posix_spawn(&pid_, kPrometheus, &fa, nullptr, argv.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  ~PrometheusServer() { stop(); }
  PrometheusServer(const PrometheusServer&) = delete;
  PrometheusServer& operator=(const PrometheusServer&) = delete;

  bool started() const { return pid_ > 0; }
  int port() const { return port_; }
  const std::string& log_path() const { return log_; }
  void stop() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGTERM);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  std::filesystem::path dir_;
  int port_;
  std::string log_;
  pid_t pid_ = -1;
};

}  // namespace meshtrain::obs::testing
