// See scrape_server_settings.h.
#include "meshtrain/obs/scrape_server_settings.h"

#include <sys/socket.h>

namespace meshtrain::obs {
namespace {

using namespace std::chrono_literals;

// Prometheus sends a whole request at once and answers within its scrape timeout; a client that
// has not sent a request line in this long is not a scraper.
constexpr time_t kReadTimeoutS = 2;
constexpr time_t kWriteTimeoutS = 5;
constexpr time_t kKeepAliveTimeoutS = 2;
constexpr size_t kKeepAliveMaxCount = 100;
constexpr auto kIdleThreadExit = 10s;

}  // namespace

GrowingThreadPool::GrowingThreadPool(size_t min_threads, size_t max_threads,
                                     std::chrono::milliseconds idle_exit)
    : min_threads_(min_threads), max_threads_(max_threads), idle_exit_(idle_exit) {}

GrowingThreadPool::~GrowingThreadPool() {
  shutdown();
}

size_t GrowingThreadPool::threads() const {
  std::lock_guard lock(mu_);
  return threads_.size() - exited_.size();
}

void GrowingThreadPool::join_exited_locked(std::vector<std::thread>& out) {
  for (const auto& id : exited_) {
    auto it = threads_.find(id);
    out.push_back(std::move(it->second));
    threads_.erase(it);
  }
  exited_.clear();
}

void GrowingThreadPool::enqueue(std::function<void()> fn) {
  std::vector<std::thread> done;
  {
    std::lock_guard lock(mu_);
    join_exited_locked(done);
    jobs_.push_back(std::move(fn));
    if (jobs_.size() <= idle_) {
      cv_.notify_one();
    } else if (threads_.size() < max_threads_) {
      std::thread t([this] { work(); });
      const auto id = t.get_id();
      threads_.emplace(id, std::move(t));
    }
    // Else the job waits for the next thread that is free.
  }
  for (auto& t : done) t.join();  // they have left work() already
}

void GrowingThreadPool::work() {
  std::unique_lock lock(mu_);
  while (true) {
    ++idle_;
    const bool woken = cv_.wait_for(lock, idle_exit_, [&] { return shutdown_ || !jobs_.empty(); });
    --idle_;
    if (!jobs_.empty()) {
      std::function<void()> fn = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      fn();
      lock.lock();
      continue;
    }
    if (shutdown_) return;
    if (!woken && threads_.size() - exited_.size() > min_threads_) break;
  }
  exited_.push_back(std::this_thread::get_id());
}

void GrowingThreadPool::shutdown() {
  std::vector<std::thread> all;
  {
    std::lock_guard lock(mu_);
    if (shutdown_) return;
    shutdown_ = true;
    cv_.notify_all();
    for (auto& [id, t] : threads_) all.push_back(std::move(t));
    threads_.clear();
    exited_.clear();
  }
  for (auto& t : all) t.join();
}

ScrapeServerSettings::ScrapeServerSettings(httplib::Server& server) {
  std::shared_ptr<int> fd = listen_fd_;
  server.set_socket_options([fd](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    *fd = sock;
  });
  server.new_task_queue = [] {
    return new GrowingThreadPool(kMinScrapeThreads, kMaxScrapeThreads, kIdleThreadExit);
  };
  server.set_read_timeout(kReadTimeoutS, 0);
  server.set_write_timeout(kWriteTimeoutS, 0);
  server.set_keep_alive_timeout(kKeepAliveTimeoutS);
  server.set_keep_alive_max_count(kKeepAliveMaxCount);
}

void ScrapeServerSettings::widen_backlog() const {
  // listen() again on a listening socket only changes its backlog (Linux).
  if (*listen_fd_ >= 0) ::listen(*listen_fd_, SOMAXCONN);
}

}  // namespace meshtrain::obs
