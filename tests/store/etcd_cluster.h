// A real etcd cluster on loopback for tests: N members on free ports with a temporary data
// directory, started as child processes, ready once every member reports itself healthy, and
// killed on destruction. A missing etcd binary is an error (std::runtime_error naming the
// package), never a skip: the etcd-backed rendezvous must be tested wherever the suite runs.
#pragma once

#include <fcntl.h>
#include <httplib.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/comm/socket.h"

namespace meshtrain::testing {

// Appends its parts; avoids `"literal" + std::string` chains, which GCC 12 at -O3 flags with a
// false -Wrestrict.
template <typename... Parts>
std::string concat(const Parts&... parts) {
  std::string out;
  (out.append(parts), ...);
  return out;
}

class EtcdCluster {
 public:
  explicit EtcdCluster(int members) {
    const std::string binary = find_etcd();
    static int counter = 0;
    // Memory-backed when the machine has /dev/shm: every etcd write is an fsync, which on a
    // loaded disk makes the tests slow without testing anything more.
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm")
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    dir_ = base / concat(std::string("meshtrain_etcd_"), std::to_string(::getpid()),
                         std::string("_"), std::to_string(counter++));
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    // Ports are taken from the kernel and released just before etcd binds them.
    std::vector<uint16_t> client_ports, peer_ports;
    {
      std::vector<comm::Socket> holders;
      for (int i = 0; i < 2 * members; ++i) {
        holders.push_back(comm::Socket::listen("127.0.0.1", 0));
        (i % 2 == 0 ? client_ports : peer_ports).push_back(holders.back().local_port());
      }
    }
    std::string initial;
    for (int i = 0; i < members; ++i) {
      initial += concat(std::string(i ? "," : ""), name(i), std::string("=http://127.0.0.1:"),
                        std::to_string(peer_ports[i]));
    }
    for (int i = 0; i < members; ++i) {
      const std::string client =
          concat(std::string("http://127.0.0.1:"), std::to_string(client_ports[i]));
      const std::string peer =
          concat(std::string("http://127.0.0.1:"), std::to_string(peer_ports[i]));
      endpoints_.push_back(concat(std::string("127.0.0.1:"), std::to_string(client_ports[i])));
      // Short heartbeats so that a new leader is elected quickly after a member is killed.
      std::vector<std::string> args = {binary,
                                       "--name",
                                       name(i),
                                       "--data-dir",
                                       (dir_ / name(i)).string(),
                                       "--listen-client-urls",
                                       client,
                                       "--advertise-client-urls",
                                       client,
                                       "--listen-peer-urls",
                                       peer,
                                       "--initial-advertise-peer-urls",
                                       peer,
                                       "--initial-cluster",
                                       initial,
                                       "--initial-cluster-token",
                                       dir_.filename().string(),
                                       "--heartbeat-interval",
                                       "50",
                                       "--election-timeout",
                                       "500",
                                       "--log-level",
                                       "warn"};
      pids_.push_back(spawn(args, (dir_ / concat(name(i), std::string(".log"))).string()));
    }
    wait_healthy();
  }

  ~EtcdCluster() {
    for (size_t i = 0; i < pids_.size(); ++i) kill(static_cast<int>(i));
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  EtcdCluster(const EtcdCluster&) = delete;
  EtcdCluster& operator=(const EtcdCluster&) = delete;

  // "127.0.0.1:p0,127.0.0.1:p1,..."
  std::string endpoint_list() const {
    std::string s;
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      if (i) s += ",";
      s += endpoints_[i];
    }
    return s;
  }
  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // SIGKILL, as a crashed machine would leave it.
  void kill(int member) {
    pid_t& pid = pids_.at(static_cast<size_t>(member));
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }

  std::string log(int member) const {
    std::ifstream in(dir_ / concat(name(member), std::string(".log")));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }

 private:
  static std::string name(int i) {
    std::string n = "m";
    n += std::to_string(i);
    return n;
  }

  static std::string find_etcd() {
    const char* path = std::getenv("PATH");
    std::stringstream dirs(concat(std::string(path ? path : ""), std::string(":/usr/bin")));
    for (std::string d; std::getline(dirs, d, ':');) {
      if (d.empty()) continue;
      std::string candidate = concat(d, std::string("/etcd"));
      if (::access(candidate.c_str(), X_OK) == 0) return candidate;
    }
    throw std::runtime_error(
        "the etcd server binary was not found on PATH: install the Debian package etcd-server "
        "(scripts/install-deps.sh) to run the etcd rendezvous tests");
  }

  static pid_t spawn(std::vector<std::string> args, const std::string& log_path) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = ::getpid();
    pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("fork failed for etcd");
    if (pid == 0) {
      // Dies with the test program, however that ends.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(126);
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return pid;
  }

  void wait_healthy() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    for (size_t i = 0; i < endpoints_.size(); ++i) {
      httplib::Client c(concat(std::string("http://"), endpoints_[i]));
      c.set_connection_timeout(std::chrono::milliseconds(200));
      c.set_read_timeout(std::chrono::seconds(2));
      while (true) {
        int status = 0;
        if (::waitpid(pids_[i], &status, WNOHANG) == pids_[i]) {
          pids_[i] = -1;
          throw std::runtime_error(concat(std::string("etcd member "), name(static_cast<int>(i)),
                                          std::string(" exited during start-up:\n"),
                                          log(static_cast<int>(i))));
        }
        auto res = c.Get("/health");
        if (res && res->status == 200 && res->body.find("\"true\"") != std::string::npos) break;
        if (std::chrono::steady_clock::now() > deadline) {
          throw std::runtime_error(concat(std::string("etcd at "), endpoints_[i],
                                          std::string(" did not become healthy:\n"),
                                          log(static_cast<int>(i))));
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  std::filesystem::path dir_;
  std::vector<std::string> endpoints_;
  std::vector<pid_t> pids_;
};

}  // namespace meshtrain::testing
