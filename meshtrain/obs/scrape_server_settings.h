// How our read-only HTTP endpoints (a worker's /metrics, meshrun's aggregated /metrics) use
// cpp-httplib so that slow or idle clients cannot starve a scrape. cpp-httplib serves each
// connection on one pool thread for the connection's whole life, so a client that sends half a
// request line and waits holds a thread until the read timeout. Hence: a pool that starts small
// and grows with the open connections (up to kMaxScrapeThreads, shrinking again when idle),
// short read, write and keep-alive timeouts, and a listen backlog large enough for a burst of
// scrapers (cpp-httplib's is 5, which drops connection attempts into a 1 s SYN retry).
#pragma once

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace meshtrain::obs {

inline constexpr size_t kMinScrapeThreads = 2;
inline constexpr size_t kMaxScrapeThreads = 256;

// A cpp-httplib task queue whose threads start on demand, up to a limit, and end after a while
// without work (down to a minimum).
class GrowingThreadPool : public httplib::TaskQueue {
 public:
  GrowingThreadPool(size_t min_threads, size_t max_threads, std::chrono::milliseconds idle_exit);
  ~GrowingThreadPool() override;
  void enqueue(std::function<void()> fn) override;
  // Runs the queued jobs, then ends every thread.
  void shutdown() override;
  size_t threads() const;

 private:
  void work();
  void join_exited_locked(std::vector<std::thread>& out);

  const size_t min_threads_;
  const size_t max_threads_;
  const std::chrono::milliseconds idle_exit_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  std::map<std::thread::id, std::thread> threads_;
  std::vector<std::thread::id> exited_;
  size_t idle_ = 0;
  bool shutdown_ = false;
};

// Sets the pool, the timeouts and the socket options (SO_REUSEADDR only: cpp-httplib's default
// SO_REUSEPORT would let a second server share a port another live process serves) on a server
// before it binds. Call widen_backlog() with the result once it is bound.
class ScrapeServerSettings {
 public:
  explicit ScrapeServerSettings(httplib::Server& server);
  void widen_backlog() const;

 private:
  std::shared_ptr<int> listen_fd_ = std::make_shared<int>(-1);
};

}  // namespace meshtrain::obs
