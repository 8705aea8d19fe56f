// Point-to-point messages over TCP. Each rank listens on one port (published in the store);
// connections are made lazily, the first time a rank sends to a peer, and each is used in one
// direction only (the connecting rank sends, the accepting rank receives), so two ranks never
// race to connect to each other and a ring touches two connections per rank. Every connection
// is authenticated with the job token (auth.h) before any other byte, then announces its rank.
// One I/O thread per transport polls the non-blocking sockets and moves the bytes of every
// pending request directly between sockets and user buffers; a send with nothing queued ahead is
// written by the posting thread, and a thread waiting for receives reads their sockets itself
// (the I/O thread leaves those meanwhile), so a small message costs no thread switch. Frames carry
// a fixed 24-byte header (magic, type, tag, length) that is validated before anything is allocated.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/store.h"
#include "meshtrain/comm/transport/transport.h"

namespace meshtrain::comm {

struct TcpTransportOptions {
  std::string key_prefix;  // store keys: <prefix>tcp/addr/<rank>
  std::string address = "127.0.0.1";
  AuthToken token;
  Duration connect_timeout = std::chrono::seconds(60);
  // TLS on every connection (tls.h). Unset: default_tls() (MESHTRAIN_TLS_*, dist.tls*);
  // null: plaintext.
  std::optional<std::shared_ptr<const TlsContext>> tls;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(std::shared_ptr<Store> store, int rank, int size, TcpTransportOptions opts);
  ~TcpTransport() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  RequestPtr post_send(int peer, uint64_t tag, const void* data, size_t bytes,
                       SteadyTime deadline) override;
  RequestPtr post_recv(int peer, uint64_t tag, void* data, size_t bytes,
                       SteadyTime deadline) override;
  void abort(const std::string& reason) override;
  std::vector<int> pending_peers() const override;
  void watch(const RequestPtr& request) override;

  // Frames longer than this are refused (a data frame must also match its receive's size).
  static constexpr uint64_t kMaxFrameBytes = uint64_t{1} << 34;
  static constexpr uint64_t kMaxEarlyBytes = uint64_t{1} << 30;

 private:
  struct Out {
    Socket socket;
    std::deque<RequestPtr> queue;
    uint8_t header[24];
    size_t header_sent = 0;
    bool failed = false;
  };
  struct In {
    Socket socket;
    uint8_t header[24];
    size_t header_got = 0;
    bool have_frame = false;
    uint64_t tag = 0;
    uint64_t bytes = 0;
    uint64_t done = 0;
    RequestPtr target;
    std::vector<uint8_t> early;
    bool early_active = false;
    bool closed = false;
    int driven = 0;  // threads reading this socket while they wait; the I/O thread leaves it
    bool io_excluded = false;  // left out of the I/O thread's last poll set
  };

  void accept_loop();
  void io_loop();
  void connect_to(int peer, SteadyTime deadline);
  void wake();
  bool progress_out(int peer, Out& out);
  bool progress_in(int peer, In& in);
  void fail_peer(int peer, const std::string& why);
  void fail_all_locked(const std::string& why);
  void run_completions();
  // Request::driver of a receive: reads the peer's socket on the waiting thread.
  void drive_recv(Request& req);

  std::shared_ptr<Store> store_;
  const int rank_;
  const int size_;
  const TcpTransportOptions opts_;
  std::shared_ptr<const TlsContext> tls_;
  Socket listener_;
  int wake_fd_[2] = {-1, -1};

  std::mutex connect_mu_;  // serialises lazy connects
  mutable std::mutex mu_;
  std::map<int, std::unique_ptr<Out>> out_;
  std::map<int, std::unique_ptr<In>> in_;
  std::map<int, std::deque<RequestPtr>> recvs_;
  EarlyMessages early_;
  std::map<int, std::string> peer_failed_;
  std::vector<std::pair<RequestPtr, std::exception_ptr>> completions_;
  std::string aborted_;
  std::atomic<bool> stopping_{false};
  std::thread accept_thread_;
  std::thread io_thread_;
};

}  // namespace meshtrain::comm
