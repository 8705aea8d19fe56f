// A real S3-compatible server for the object-storage tests: npm's s3rver (pinned in
// tests/s3server, installed by scripts/install-deps.sh), started on a free port with its data in
// a directory of the test, polled until it accepts connections, and killed and reaped when the
// owner goes (also when an assertion returned early). It takes s3rver's built-in credentials,
// S3RVER / S3RVER, and creates one bucket at start.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "tests/support/child_process.h"
#include "tests/support/wait.h"

namespace meshtrain::testing {

class S3Server {
 public:
  static std::string script() {
    return std::string(MESHTRAIN_SOURCE_DIR) + "/tests/s3server/node_modules/s3rver/bin/s3rver.js";
  }
  // Why the server cannot run here, or nothing.
  static std::optional<std::string> missing() {
    if (std::system("node --version >/dev/null 2>&1") != 0) return "node is not installed";
    if (!std::filesystem::exists(script()))
      return "s3rver is not installed (scripts/install-deps.sh installs tests/s3server)";
    return std::nullopt;
  }

  S3Server(std::filesystem::path dir, std::string bucket = "meshtrain")
      : dir_(std::move(dir)), bucket_(std::move(bucket)), port_(free_port()) {}
  ~S3Server() { stop(); }

  // Starts it (again, on the same port and data) and waits until it accepts connections; false
  // when it did not within 30 s.
  bool start() {
    std::filesystem::create_directories(dir_ / "data");
    ++starts_;
    process_ = spawn_shell("node " + script() + " -a 127.0.0.1 -p " + std::to_string(port_) +
                               " -d " + (dir_ / "data").string() + " --configure-bucket " + bucket_,
                           (dir_ / "s3rver.log").string(), /*append=*/true);
    return wait_until([&] { return accepts(); }, std::chrono::seconds(30),
                      std::chrono::milliseconds(20)) &&
           wait_until([&] { return log_says_listening(); }, std::chrono::seconds(10),
                      std::chrono::milliseconds(20));
  }
  void stop() { process_.kill_and_reap(); }

  int port() const { return port_; }
  const std::string& bucket() const { return bucket_; }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string uri(const std::string& prefix) const { return "s3://" + bucket_ + "/" + prefix; }
  // The environment a client needs, as `VAR=value ...` for a shell command line.
  std::string env(const std::string& key_id = "S3RVER") const {
    return "AWS_ENDPOINT_URL=" + endpoint() + " AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=" + key_id +
           " AWS_SECRET_ACCESS_KEY=S3RVER ";
  }
  // The same in this process.
  void set_env() const {
    ::setenv("AWS_ENDPOINT_URL", endpoint().c_str(), 1);
    ::setenv("AWS_REGION", "us-east-1", 1);
    ::setenv("AWS_ACCESS_KEY_ID", "S3RVER", 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", "S3RVER", 1);
  }

 private:
  static int free_port() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    ::close(fd);
    return ntohs(a.sin_port);
  }
  bool accepts() const {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port_));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
    ::close(fd);
    return ok;
  }
  // s3rver accepts connections before its buckets are configured; it logs when it is ready.
  bool log_says_listening() const {
    std::ifstream in(dir_ / "s3rver.log");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    size_t count = 0;
    for (size_t pos = 0; (pos = text.find("S3rver listening", pos)) != std::string::npos; ++pos)
      ++count;
    return count >= starts_;
  }

  std::filesystem::path dir_;
  std::string bucket_;
  int port_;
  ChildProcess process_;
  size_t starts_ = 0;  // how many "listening" lines the log must hold (restarts append)
};

}  // namespace meshtrain::testing
