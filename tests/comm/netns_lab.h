// Simulated hosts for multi-host tests: network namespaces joined by veth pairs to a bridge that
// lives in a namespace of its own, with private addresses 10.231.0.<host+1>/24 that exist only
// inside the namespaces this lab created. Programs run inside a host with `ip netns exec`; a
// host's link can be cut from the bridge side. Everything is removed when the lab is destroyed.
// Creating namespaces needs root: available() says why a lab could not be made.
#pragma once

#include <fcntl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "tests/support/child_process.h"

namespace meshtrain::comm::testing {

class NetnsLab {
 public:
  explicit NetnsLab(int hosts) {
    if (::geteuid() != 0) {
      reason_ = "network-namespace tests need root";
      return;
    }
    // Short names: interface names are limited to 15 bytes.
    prefix_ = "mtc" + std::to_string(::getpid() % 100000);
    switch_ = prefix_ + "sw";
    for (int h = 0; h < hosts; ++h) hosts_.push_back(prefix_ + "h" + std::to_string(h));
    remove_all();  // leftovers of an earlier run with the same pid
    std::string out;
    if (!run({"ip", "netns", "add", switch_}, &out)) {
      reason_ = "`ip netns add` failed: " + out;
      hosts_.clear();
      switch_.clear();
      return;
    }
    bool ok = run({"ip", "-n", switch_, "link", "add", "br0", "type", "bridge"}, &out) &&
              run({"ip", "-n", switch_, "link", "set", "br0", "up"}, &out);
    for (int h = 0; h < hosts && ok; ++h) {
      const std::string& ns = hosts_[h];
      const std::string port = "p" + std::to_string(h);
      ok = run({"ip", "netns", "add", ns}, &out) &&
           run({"ip", "-n", switch_, "link", "add", port, "type", "veth", "peer", "name", "eth0",
                "netns", ns},
               &out) &&
           run({"ip", "-n", switch_, "link", "set", port, "master", "br0", "up"}, &out) &&
           run({"ip", "-n", ns, "addr", "add", address(h) + "/24", "dev", "eth0"}, &out) &&
           run({"ip", "-n", ns, "link", "set", "eth0", "up"}, &out) &&
           run({"ip", "-n", ns, "link", "set", "lo", "up"}, &out);
    }
    if (!ok) reason_ = "could not set up the namespaces: " + out;
  }
  ~NetnsLab() { remove_all(); }
  NetnsLab(const NetnsLab&) = delete;
  NetnsLab& operator=(const NetnsLab&) = delete;

  // Empty when the lab is up; otherwise why not (not root, no `ip netns`, ...).
  const std::string& unavailable_reason() const { return reason_; }
  bool available() const { return reason_.empty(); }

  std::string address(int host) const { return "10.231.0." + std::to_string(host + 1); }
  const std::string& host_namespace(int host) const { return hosts_[host]; }

  // Starts argv inside a host with extra environment variables; stdout and stderr go to
  // log_path. The process is killed and reaped when the returned handle goes.
  ::meshtrain::testing::ChildProcess spawn(int host, const std::vector<std::string>& argv,
                                           const std::map<std::string, std::string>& env,
                                           const std::string& log_path) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      std::vector<std::string> full = {"ip", "netns", "exec", hosts_[host]};
      full.insert(full.end(), argv.begin(), argv.end());
      std::vector<char*> args;
      for (auto& a : full) args.push_back(a.data());
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    if (pid > 0) ::setpgid(pid, pid);
    return ::meshtrain::testing::ChildProcess(pid);
  }
  // Takes a host's link down at the bridge (its packets are dropped silently, as with a pulled
  // cable: no reset reaches either side).
  bool cut_link(int host) {
    return run({"ip", "-n", switch_, "link", "set", "p" + std::to_string(host), "down"});
  }

 private:
  static bool run(const std::vector<std::string>& argv, std::string* output = nullptr) {
    int pipe_fd[2];
    if (::pipe2(pipe_fd, O_CLOEXEC) != 0) return false;
    pid_t pid = ::fork();
    if (pid < 0) return false;
    if (pid == 0) {
      ::dup2(pipe_fd[1], 1);
      ::dup2(pipe_fd[1], 2);
      std::vector<std::string> copy = argv;
      std::vector<char*> args;
      for (auto& a : copy) args.push_back(a.data());
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    ::close(pipe_fd[1]);
    std::string text;
    char buf[512];
    for (ssize_t n; (n = ::read(pipe_fd[0], buf, sizeof(buf))) > 0;) text.append(buf, n);
    ::close(pipe_fd[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    if (output != nullptr) *output = text;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  void remove_all() {
    // Deleting a namespace deletes the veth ends inside it, and with them their peers.
    for (const auto& ns : hosts_) run({"ip", "netns", "del", ns});
    if (!switch_.empty()) run({"ip", "netns", "del", switch_});
  }

  std::string prefix_;
  std::string switch_;
  std::vector<std::string> hosts_;
  std::string reason_;
};

}  // namespace meshtrain::comm::testing
