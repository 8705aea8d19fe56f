// See tcp_store.h. The client's socket deadline for a blocking get/wait is the server-side wait
// plus the request timeout, so the server's kTimeout reply (which names the keys) normally
// arrives first; a request the server answers at once gets the request timeout alone.
#include "meshtrain/comm/tcp_store.h"

#include "meshtrain/comm/frame.h"
#include "meshtrain/comm/store_protocol.h"
#include "meshtrain/comm/tls.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
TcpStore::TcpStore(std::string host, uint16_t port, TcpStoreOptions options)
    : host_(std::move(host)), port_(port) {
  timeout_ = options.timeout;
  request_timeout_ = options.request_timeout.value_or(options.timeout);
  token_ = options.token ? *options.token : AuthToken::from_env();
  tls_ = options.tls ? *options.tls : default_tls();
  if (options.is_server) {
    TcpStoreServerOptions so;
    so.host = options.listen_host;
    so.port = port;
    so.token = token_;
    so.tls = tls_;
    server_ = std::make_unique<TcpStoreServer>(std::move(so));
    port_ = server_->port();
  }
  std::lock_guard lock(mu_);
  connect_locked(Deadline(timeout_));
}

TcpStore::~TcpStore() {
  socket_.close();
  server_.reset();
}

void TcpStore::connect_locked(const Deadline& deadline) {
  Socket s = Socket::connect(host_, port_, deadline);
  if (tls_) s.start_tls(*tls_, false, deadline);
  authenticate_client(s, token_, deadline);
  socket_ = std::move(s);
  connected_once_ = true;
}

Bytes TcpStore::request(const StoreRequest& req, Duration server_wait) {
  Bytes payload = encode_store_request(req);
  std::lock_guard lock(mu_);
  // The first connection may wait for a server that is not up yet; a later one is a reconnect.
  if (!socket_)
    connect_locked(Deadline(connected_once_ ? request_timeout_ : timeout_).woken_by(wake_fd_));
  Frame frame;
  try {
    const Deadline deadline = Deadline(server_wait + request_timeout_).woken_by(wake_fd_);
    write_frame(socket_, static_cast<uint16_t>(req.op), payload, deadline);
    frame = read_frame(socket_, deadline);
  } catch (const Error&) {
    socket_.close();  // The stream's state is unknown now; reconnect next time.
    throw;
  }
  std::string message(frame.payload.begin(), frame.payload.end());
  switch (static_cast<StoreReply>(frame.type)) {
    case StoreReply::kOk:
      return std::move(frame.payload);
    case StoreReply::kTimeout:
      throw TimeoutError(message);
    case StoreReply::kError:
      MT_THROW(StoreError, "store server ", socket_.peer(), ": ", message);
  }
  socket_.close();
  MT_THROW(CommError, "unexpected reply type ", frame.type, " from store server ", host_, ":",
           port_);
}

void TcpStore::set(const std::string& key, const Bytes& value) {
  StoreRequest r;
  r.op = StoreOp::kSet;
  r.keys = {key};
  r.value = value;
  request(r, Duration(0));
}

Bytes TcpStore::get(const std::string& key) {
  StoreRequest r;
  r.op = StoreOp::kGet;
  r.keys = {key};
  r.timeout_ms = timeout_.count();
  Bytes reply = request(r, timeout_);
  WireReader in(reply);
  Bytes value = in.bytes(UINT32_MAX);
  in.finish();
  return value;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  StoreRequest r;
  r.op = StoreOp::kAdd;
  r.keys = {key};
  r.delta = delta;
  Bytes reply = request(r, Duration(0));
  WireReader in(reply);
  int64_t v = in.i64();
  in.finish();
  return v;
}

Bytes TcpStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  StoreRequest r;
  r.op = StoreOp::kCompareSet;
  r.keys = {key};
  r.expected = expected;
  r.value = desired;
  Bytes reply = request(r, Duration(0));
  WireReader in(reply);
  Bytes value = in.bytes(UINT32_MAX);
  in.finish();
  return value;
}

void TcpStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  StoreRequest r;
  r.op = StoreOp::kWait;
  r.keys = keys;
  r.timeout_ms = timeout.count();
  request(r, timeout);
}

bool TcpStore::remove(const std::string& key) {
  StoreRequest r;
  r.op = StoreOp::kRemove;
  r.keys = {key};
  Bytes reply = request(r, Duration(0));
  WireReader in(reply);
  bool existed = in.u8() != 0;
  in.finish();
  return existed;
}

bool TcpStore::check(const std::vector<std::string>& keys) {
  StoreRequest r;
  r.op = StoreOp::kCheck;
  r.keys = keys;
  Bytes reply = request(r, Duration(0));
  WireReader in(reply);
  bool all = in.u8() != 0;
  in.finish();
  return all;
}

}  // namespace meshtrain::comm
