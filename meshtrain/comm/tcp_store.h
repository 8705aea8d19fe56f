// The TcpStore client, optionally hosting the server in the same object (is_server), the way
// rank 0 hosts the store when no launcher agent does. Each client holds one authenticated
// connection; requests from several threads are serialised on it. A connection that fails
// mid-request is dropped and re-established (with a fresh handshake) on the next request.
#pragma once

#include <memory>
#include <mutex>
#include <optional>

#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/socket.h"
#include "meshtrain/comm/store.h"
#include "meshtrain/comm/tcp_store_server.h"

namespace meshtrain::comm {

struct StoreRequest;

struct TcpStoreOptions {
  bool is_server = false;
  // Operation timeout (get, wait) and the time allowed to reach the server at first.
  Duration timeout{std::chrono::seconds(300)};
  // Requests the server answers at once (set, add, compare_set, check, remove) and reaching it
  // again after a dropped connection: past this the store counts as lost (a cut link gives no
  // error, only silence). Unset: `timeout`.
  std::optional<Duration> request_timeout;
  // Unset: AuthToken::from_env().
  std::optional<AuthToken> token;
  // TLS for the connection (and the hosted server). Unset: default_tls(); null: plaintext.
  std::optional<std::shared_ptr<const TlsContext>> tls;
  // Server only: where to listen; empty means every interface.
  std::string listen_host;
};

class TcpStore : public Store {
 public:
  // With is_server, listens on `port` (0: a free one) and connects to itself through `host`.
  TcpStore(std::string host, uint16_t port, TcpStoreOptions options = {});
  ~TcpStore() override;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& host() const { return host_; }
  uint16_t port() const { return port_; }
  // Every request gives up with InterruptedError once `fd` is readable (-1: never), e.g. a
  // signalfd, so that a signal is acted on even while a request waits on a silent server.
  void set_wake_fd(int fd) { wake_fd_ = fd; }
  // The hosted server, or null for a plain client.
  TcpStoreServer* server() { return server_.get(); }

 private:
  // server_wait: how long the server may hold the request (get, wait); 0 for the others.
  Bytes request(const StoreRequest& req, Duration server_wait);
  void connect_locked(const Deadline& deadline);

  std::string host_;
  uint16_t port_;
  AuthToken token_;
  std::shared_ptr<const TlsContext> tls_;
  Duration request_timeout_;
  int wake_fd_ = -1;
  bool connected_once_ = false;
  std::unique_ptr<TcpStoreServer> server_;
  std::mutex mu_;
  Socket socket_;
};

}  // namespace meshtrain::comm
