// See worker_output.h.
#include "meshtrain/runtime/worker_output.h"

#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include "meshtrain/comm/socket.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

// A line longer than this is forwarded in pieces rather than buffered without bound.
constexpr size_t kMaxLine = 64 * 1024;

void write_fully(int fd, const std::string& s) {
  const char* p = s.data();
  size_t left = s.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // The launcher's own output is gone; nothing better to do.
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace

WorkerOutput::WorkerOutput() {
  if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) < 0) MT_THROW(IoError, "cannot create a pipe");
}

WorkerOutput::~WorkerOutput() {
  finish(std::chrono::milliseconds(0));
  for (auto& s : streams_) {
    if (s.fd >= 0) ::close(s.fd);
  }
  for (int fd : wake_) ::close(fd);
}

void WorkerOutput::add(int read_fd, int target_fd, std::string prefix) {
  {
    std::lock_guard lock(mu_);
    streams_.push_back(Stream{read_fd, target_fd, std::move(prefix), {}});
  }
  // The thread polls the new pipe from its next round.
  char b = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
}

void WorkerOutput::start() {
  thread_ = std::thread([this] { loop(); });
}

void WorkerOutput::finish(std::chrono::milliseconds drain) {
  if (!thread_.joinable()) return;
  {
    std::lock_guard lock(mu_);
    drain_deadline_ = std::chrono::steady_clock::now() + drain;
  }
  finishing_.store(true);
  char b = 1;
  [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
  thread_.join();
}

void WorkerOutput::emit(Stream& s, const char* data, size_t n) {
  s.pending.append(data, n);
  size_t start = 0;
  while (true) {
    size_t nl = s.pending.find('\n', start);
    if (nl == std::string::npos) break;
    write_fully(s.target, s.prefix + s.pending.substr(start, nl - start + 1));
    start = nl + 1;
  }
  s.pending.erase(0, start);
  if (s.pending.size() >= kMaxLine) flush_partial(s);
}

void WorkerOutput::flush_partial(Stream& s) {
  if (s.pending.empty()) return;
  write_fully(s.target, s.prefix + s.pending + "\n");
  s.pending.clear();
}

void WorkerOutput::loop() {
  comm::block_signals_in_this_thread();
  std::vector<pollfd> fds;
  std::vector<Stream*> owners;
  char buf[16384];
  while (true) {
    fds.clear();
    owners.clear();
    fds.push_back(pollfd{wake_[0], POLLIN, 0});
    {
      std::lock_guard lock(mu_);
      for (auto& s : streams_) {
        if (s.fd >= 0) {
          fds.push_back(pollfd{s.fd, POLLIN, 0});
          owners.push_back(&s);
        }
      }
    }
    // Every pipe closed: a replaced worker's new ones may still come until finish().
    if (owners.empty() && finishing_.load()) break;
    int timeout = -1;
    if (finishing_.load()) {
      std::lock_guard lock(mu_);
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          drain_deadline_ - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      timeout = static_cast<int>(left.count());
    }
    int rc = ::poll(fds.data(), fds.size(), timeout);
    if (rc < 0 && errno == EINTR) continue;
    if (rc < 0) break;
    if (fds[0].revents & POLLIN) {
      char drain[64];
      while (::read(wake_[0], drain, sizeof(drain)) > 0) {
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Stream& s = *owners[i - 1];
      ssize_t n = ::read(s.fd, buf, sizeof(buf));
      if (n > 0) {
        emit(s, buf, static_cast<size_t>(n));
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        flush_partial(s);
        ::close(s.fd);
        s.fd = -1;
      }
    }
  }
  std::lock_guard lock(mu_);
  for (auto& s : streams_) flush_partial(s);
}

}  // namespace meshtrain::runtime
