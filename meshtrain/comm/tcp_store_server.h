// The TcpStore server: a listening socket and one thread per connected client, in front of a
// HashStore. A client must pass the authentication handshake (auth.h) before its first request
// is read; a client that fails it is logged and dropped without touching the data. Blocking
// get/wait requests sleep on the HashStore's condition variable, so waiting costs no polling.
// Hosted by the launcher agent of node 0, or by rank 0 when no agent runs.
#pragma once

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/socket.h"

namespace meshtrain::comm {

struct TcpStoreServerOptions {
  std::string host;   // empty: every interface
  uint16_t port = 0;  // 0: a free port, see TcpStoreServer::port()
  AuthToken token;
  Duration handshake_timeout{std::chrono::seconds(10)};
  // TLS for every client (tls.h). Unset: default_tls(); null: plaintext.
  std::optional<std::shared_ptr<const TlsContext>> tls;
};

class TcpStoreServer {
 public:
  explicit TcpStoreServer(TcpStoreServerOptions options);
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  uint16_t port() const { return port_; }
  // Authenticated clients currently connected.
  size_t num_clients() const { return num_clients_.load(); }
  // Connections refused by the handshake so far.
  size_t num_refused() const { return num_refused_.load(); }
  // The data itself, for a host process that wants to read it without a connection.
  HashStore& data() { return data_; }

  // Closes the listener and every connection; blocked requests fail. Idempotent.
  void stop();

 private:
  struct Connection;
  void accept_loop();
  void serve(Connection* conn);
  void reap_finished();

  TcpStoreServerOptions options_;
  std::shared_ptr<const TlsContext> tls_;
  Socket listener_;
  uint16_t port_ = 0;
  HashStore data_;
  int wake_pipe_[2] = {-1, -1};
  std::thread acceptor_;
  std::mutex mu_;
  std::list<std::unique_ptr<Connection>> connections_;
  std::atomic<bool> stopping_{false};
  std::atomic<size_t> num_clients_{0};
  std::atomic<size_t> num_refused_{0};
};

}  // namespace meshtrain::comm
