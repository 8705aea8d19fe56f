// See tls.h. The Socket members that run TLS (start_tls, try_sendv, try_recv, events_wanted,
// error_text) live here with the rest of the OpenSSL code; socket.cpp only dispatches to them.
#include "meshtrain/comm/tls.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "meshtrain/comm/socket.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {
namespace {

// The oldest error on this thread's OpenSSL queue, as its reason text; the queue is cleared.
std::string take_openssl_error(const char* fallback = "unknown TLS error") {
  unsigned long first = ERR_get_error();
  ERR_clear_error();
  if (first == 0) return fallback;
  const char* reason = ERR_reason_error_string(first);
  if (reason != nullptr) return reason;
  char buf[256];
  ERR_error_string_n(first, buf, sizeof(buf));
  return buf;
}

bool parse_bool(const std::string& v, bool* out) {
  std::string s = v;
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "1" || s == "true" || s == "yes" || s == "on") {
    *out = true;
    return true;
  }
  if (s.empty() || s == "0" || s == "false" || s == "no" || s == "off") {
    *out = false;
    return true;
  }
  return false;
}

void check_readable(const std::string& from, const std::string& path) {
  if (path.empty()) MT_THROW(ValueError, "TLS is on but ", from, " is not set");
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    MT_THROW(ValueError, from, " = \"", path, "\": cannot read the file: ", std::strerror(errno));
  }
  std::fclose(f);
}

std::string name_text(X509_NAME* name) {
  if (name == nullptr) return "?";
  char buf[256];
  X509_NAME_oneline(name, buf, sizeof(buf));
  return buf;
}

std::mutex g_default_mu;
bool g_default_set = false;
std::shared_ptr<const TlsContext> g_default;

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Free>;
using PkeyPtr = std::unique_ptr<EVP_PKEY, PkeyFree>;

X509Ptr read_cert(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) MT_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
  X509* x = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (x == nullptr) MT_THROW(IoError, path, " is not a PEM certificate: ", take_openssl_error());
  return X509Ptr(x);
}

PkeyPtr read_key(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) MT_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
  EVP_PKEY* k = PEM_read_PrivateKey(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (k == nullptr) MT_THROW(IoError, path, " is not a PEM private key: ", take_openssl_error());
  return PkeyPtr(k);
}

void write_pem(const std::string& path, bool secret, const std::function<int(FILE*)>& write) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, secret ? 0600 : 0644);
  if (fd < 0) MT_THROW(IoError, "cannot write ", path, ": ", std::strerror(errno));
  FILE* f = ::fdopen(fd, "wb");
  if (f == nullptr) {
    ::close(fd);
    MT_THROW(IoError, "cannot write ", path, ": ", std::strerror(errno));
  }
  const bool ok = write(f) == 1;
  const bool closed = std::fclose(f) == 0;
  if (!ok || !closed)
    MT_THROW(IoError, "cannot write ", path, ": ", take_openssl_error("I/O error"));
}

void add_ext(X509* cert, X509V3_CTX* ctx, int nid, const std::string& value) {
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, ctx, nid, value.c_str());
  if (ext == nullptr)
    MT_THROW(ValueError, "bad certificate extension '", value, "': ", take_openssl_error());
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

bool is_ip(const std::string& h) {
  unsigned char buf[16];
  return inet_pton(AF_INET, h.c_str(), buf) == 1 || inet_pton(AF_INET6, h.c_str(), buf) == 1;
}

// A fresh key and a certificate for it, signed by `issuer_key` (self-signed when issuer is null).
void make_cert(const CertOptions& o, bool ca, X509* issuer, EVP_PKEY* issuer_key,
               const std::string& cert_path, const std::string& key_path) {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) MT_THROW(Error, "cannot generate an EC key: ", take_openssl_error());
  X509Ptr x(X509_new());
  X509_set_version(x.get(), 2);
  BIGNUM* serial = BN_new();
  BN_rand(serial, 127, BN_RAND_TOP_ANY, BN_RAND_BOTTOM_ANY);
  BN_to_ASN1_INTEGER(serial, X509_get_serialNumber(x.get()));
  BN_free(serial);
  X509_gmtime_adj(X509_getm_notBefore(x.get()), static_cast<long>(o.not_before_s));
  X509_gmtime_adj(X509_getm_notAfter(x.get()), static_cast<long>(o.not_after_s));
  X509_set_pubkey(x.get(), key.get());
  X509_NAME* name = X509_get_subject_name(x.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("meshtrain"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(o.common_name.c_str()), -1, -1,
                             0);
  X509_set_issuer_name(x.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer != nullptr ? issuer : x.get(), x.get(), nullptr, nullptr, 0);
  add_ext(x.get(), &ctx, NID_subject_key_identifier, "hash");
  if (ca) {
    add_ext(x.get(), &ctx, NID_basic_constraints, "critical,CA:TRUE,pathlen:0");
    add_ext(x.get(), &ctx, NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add_ext(x.get(), &ctx, NID_authority_key_identifier, "keyid:always");
    add_ext(x.get(), &ctx, NID_basic_constraints, "critical,CA:FALSE");
    add_ext(x.get(), &ctx, NID_key_usage, "critical,digitalSignature");
    add_ext(x.get(), &ctx, NID_ext_key_usage, "serverAuth,clientAuth");
    std::string san;
    for (const auto& h : o.hosts) {
      if (!san.empty()) san += ",";
      san += (is_ip(h) ? "IP:" : "DNS:") + h;
    }
    if (!san.empty()) add_ext(x.get(), &ctx, NID_subject_alt_name, san);
  }
  if (X509_sign(x.get(), issuer_key != nullptr ? issuer_key : key.get(), EVP_sha256()) == 0) {
    MT_THROW(Error, "cannot sign the certificate: ", take_openssl_error());
  }
  write_pem(key_path, true, [&](FILE* f) {
    return PEM_write_PrivateKey(f, key.get(), nullptr, nullptr, 0, nullptr, nullptr);
  });
  write_pem(cert_path, false, [&](FILE* f) { return PEM_write_X509(f, x.get()); });
}

// Ciphertext on its way out. SSL writes its records into this buffer (a BIO of ours) instead of
// one system call per 16 KiB record; the socket layer sends it in large calls. `unreported` is
// plaintext already encrypted whose bytes the caller has not been told are sent: they are reported
// once their ciphertext has left, so a send completes only when its bytes are in the kernel.
struct OutBuffer {
  std::vector<uint8_t> bytes;
  size_t head = 0;
  size_t unreported = 0;
  size_t pending() const { return bytes.size() - head; }
};

int out_write(BIO* b, const char* in, int n) {
  auto* o = static_cast<OutBuffer*>(BIO_get_data(b));
  if (o->head == o->bytes.size()) {
    o->bytes.clear();
    o->head = 0;
  }
  o->bytes.insert(o->bytes.end(), in, in + n);
  return n;
}

long out_ctrl(BIO* b, int cmd, long, void*) {
  auto* o = static_cast<OutBuffer*>(BIO_get_data(b));
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_WPENDING:
    case BIO_CTRL_PENDING:
      return static_cast<long>(o->pending());
    default:
      return 0;
  }
}

int out_create(BIO* b) {
  BIO_set_data(b, new OutBuffer());
  BIO_set_init(b, 1);
  return 1;
}

int out_destroy(BIO* b) {
  delete static_cast<OutBuffer*>(BIO_get_data(b));
  BIO_set_data(b, nullptr);
  return 1;
}

BIO_METHOD* out_method() {
  static BIO_METHOD* m = [] {
    BIO_METHOD* bm = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "meshtrain-out");
    BIO_meth_set_write(bm, out_write);
    BIO_meth_set_ctrl(bm, out_ctrl);
    BIO_meth_set_create(bm, out_create);
    BIO_meth_set_destroy(bm, out_destroy);
    return bm;
  }();
  return m;
}

OutBuffer& out_buffer(SSL* ssl) {
  return *static_cast<OutBuffer*>(BIO_get_data(SSL_get_wbio(ssl)));
}

// Sends what the buffer holds without blocking: 1 when it is empty, 0 when the socket is full,
// -1 on an error (errno set).
int flush_out(int fd, OutBuffer& o) {
  while (o.pending() > 0) {
    const ssize_t n = ::send(fd, o.bytes.data() + o.head, o.pending(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      o.head += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
  }
  o.bytes.clear();
  o.head = 0;
  return 1;
}

// Plaintext encrypted per SSL_write call: 16 records, sent in one or a few system calls.
constexpr size_t kWriteChunk = size_t{256} << 10;

// Why a handshake failed, in words: the verification result when there is one.
std::string handshake_failure(SSL* ssl, int ssl_err, const std::string& openssl_reason,
                              bool server) {
  const long verify = SSL_get_verify_result(ssl);
  std::string who;
  if (X509* peer = SSL_get0_peer_certificate(ssl))
    who = " (" + name_text(X509_get_subject_name(peer)) + ")";
  if (verify != X509_V_OK) {
    std::string what = X509_verify_cert_error_string(verify);
    switch (verify) {
      case X509_V_ERR_CERT_HAS_EXPIRED:
        what = "its certificate has expired";
        break;
      case X509_V_ERR_CERT_NOT_YET_VALID:
        what = "its certificate is not valid yet";
        break;
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT_LOCALLY:
      case X509_V_ERR_UNABLE_TO_GET_ISSUER_CERT:
      case X509_V_ERR_DEPTH_ZERO_SELF_SIGNED_CERT:
      case X509_V_ERR_SELF_SIGNED_CERT_IN_CHAIN:
      case X509_V_ERR_CERT_SIGNATURE_FAILURE:
        what = "its certificate is not from this job's CA (" + what + ")";
        break;
      default:
        what = "its certificate failed verification (" + what + ")";
    }
    return what + who;
  }
  if (openssl_reason == "wrong version number" || openssl_reason == "packet length too long" ||
      openssl_reason == "http request" || openssl_reason == "record layer failure") {
    return "it speaks plaintext, not TLS (" + openssl_reason + ")";
  }
  if (openssl_reason.find("alert") != std::string::npos) {
    return "it refused our certificate or TLS settings (" + openssl_reason + ")";
  }
  if (ssl_err == SSL_ERROR_SYSCALL || ssl_err == SSL_ERROR_ZERO_RETURN) {
    return server ? "it closed the connection during the TLS handshake"
                  : "it closed the connection during the TLS handshake (a plaintext server, or "
                    "one that refused our certificate)";
  }
  return openssl_reason + who;
}

}  // namespace

TlsSettings TlsSettings::from_env() {
  TlsSettings s;
  if (auto v = env_value(Env::tls)) {
    if (!parse_bool(*v, &s.enabled))
      MT_THROW(ValueError, "MESHTRAIN_TLS = \"", *v, "\": expected 1/0, true/false, yes/no");
  }
  s.cert = env_value(Env::tls_cert).value_or("");
  s.key = env_value(Env::tls_key).value_or("");
  s.ca = env_value(Env::tls_ca).value_or("");
  return s;
}

std::shared_ptr<const TlsContext> TlsContext::load(const TlsSettings& s) {
  check_readable(s.cert_from, s.cert);
  check_readable(s.key_from, s.key);
  check_readable(s.ca_from, s.ca);
  std::shared_ptr<TlsContext> t(new TlsContext());
  SSL_CTX* ctx = SSL_CTX_new(TLS_method());
  if (ctx == nullptr) MT_THROW(Error, "SSL_CTX_new failed: ", take_openssl_error());
  t->ctx_ = ctx;
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
  // AES-128-GCM first: the fastest with AES-NI, and what the bulk transfers use.
  SSL_CTX_set_ciphersuites(ctx,
                           "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:"
                           "TLS_CHACHA20_POLY1305_SHA256");
  SSL_CTX_set_num_tickets(ctx, 0);  // no resumption: nothing the server sends unasked
  SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
  SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION);
  // Writes go to the session's own output buffer (OutBuffer), which never blocks: SSL_write
  // encrypts a whole chunk at once.
  SSL_CTX_set_mode(ctx, SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Receives read ahead into a large buffer: one system call brings many records instead of
  // two calls (header, body) per 16 KiB record. Every reader here reads until the session says
  // EAGAIN before it polls again, so nothing buffered is left unnoticed.
  SSL_CTX_set_read_ahead(ctx, 1);
  SSL_CTX_set_default_read_buffer_len(ctx, size_t{1} << 18);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  if (SSL_CTX_use_certificate_chain_file(ctx, s.cert.c_str()) != 1) {
    MT_THROW(ValueError, s.cert_from, " = \"", s.cert, "\": not a PEM certificate (",
             take_openssl_error(), ")");
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, s.key.c_str(), SSL_FILETYPE_PEM) != 1) {
    MT_THROW(ValueError, s.key_from, " = \"", s.key, "\": not a PEM private key (",
             take_openssl_error(), ")");
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    MT_THROW(ValueError, s.key_from, " = \"", s.key, "\" does not match ", s.cert_from, " = \"",
             s.cert, "\"");
  }
  if (SSL_CTX_load_verify_locations(ctx, s.ca.c_str(), nullptr) != 1) {
    MT_THROW(ValueError, s.ca_from, " = \"", s.ca, "\": not a PEM CA certificate (",
             take_openssl_error(), ")");
  }
  if (X509* own = SSL_CTX_get0_certificate(ctx)) {
    t->subject_ = name_text(X509_get_subject_name(own));
    if (X509_cmp_current_time(X509_get0_notAfter(own)) < 0) {
      MT_LOG_WARN("tls", s.cert_from, " = \"", s.cert, "\" has expired: peers will refuse it");
    }
  }
  return t;
}

TlsContext::~TlsContext() {
  if (ctx_ != nullptr) SSL_CTX_free(ctx_);
}

std::shared_ptr<const TlsContext> default_tls() {
  std::lock_guard lock(g_default_mu);
  if (!g_default_set) {
    TlsSettings s = TlsSettings::from_env();
    g_default = s.enabled ? TlsContext::load(s) : nullptr;
    g_default_set = true;
  }
  return g_default;
}

void set_default_tls(std::shared_ptr<const TlsContext> tls) {
  std::lock_guard lock(g_default_mu);
  g_default = std::move(tls);
  g_default_set = true;
}

void generate_ca(const std::string& cert_path, const std::string& key_path,
                 const CertOptions& options) {
  CertOptions o = options;
  if (o.common_name.empty()) o.common_name = "meshtrain development CA";
  make_cert(o, true, nullptr, nullptr, cert_path, key_path);
}

void generate_cert(const std::string& ca_cert_path, const std::string& ca_key_path,
                   const std::string& cert_path, const std::string& key_path,
                   const CertOptions& options) {
  X509Ptr ca = read_cert(ca_cert_path);
  PkeyPtr ca_key = read_key(ca_key_path);
  if (X509_check_private_key(ca.get(), ca_key.get()) != 1) {
    ERR_clear_error();
    MT_THROW(ValueError, ca_key_path, " is not the key of ", ca_cert_path);
  }
  CertOptions o = options;
  if (o.common_name.empty()) o.common_name = o.hosts.empty() ? "meshtrain node" : o.hosts.front();
  make_cert(o, false, ca.get(), ca_key.get(), cert_path, key_path);
}

// ---- Socket's TLS half ----

void Socket::start_tls(const TlsContext& ctx, bool server, const Deadline& deadline,
                       bool server_speaks_first) {
  const std::string who = peer_;
  auto refuse = [&](const std::string& why) {
    close();
    MT_THROW(AuthError, server ? "refused connection from " : "TLS handshake with ", who,
             server ? ": " : " failed: ", why);
  };
  if (server) {
    // A plaintext client (the job-token handshake's "MTAU", anything not a TLS record) is named
    // as such instead of as a protocol error.
    uint8_t first = 0;
    while (true) {
      ssize_t n = ::recv(fd_, &first, 1, MSG_PEEK);
      if (n == 1) break;
      if (n == 0) refuse("it closed the connection before the TLS handshake");
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) refuse(std::strerror(errno));
      try {
        wait_for(POLLIN, deadline, "waiting for the TLS handshake");
      } catch (const Error& e) {
        refuse(e.what());
      }
    }
    if (first != 0x16) refuse("it speaks plaintext, not TLS (is TLS on there?)");
  }
  ssl_ = SSL_new(ctx.native());
  if (ssl_ == nullptr) refuse("SSL_new failed: " + take_openssl_error());
  SSL_set_fd(ssl_, fd_);
  BIO* out = BIO_new(out_method());
  if (out == nullptr) refuse("BIO_new failed: " + take_openssl_error());
  SSL_set0_wbio(ssl_, out);
  // Sends what the handshake wrote, waiting for room until the deadline.
  auto flush_all = [&](bool best_effort) {
    while (true) {
      const int f = flush_out(fd_, out_buffer(ssl_));
      if (f == 1) return;
      if (f < 0) {
        if (best_effort) return;
        refuse(std::strerror(errno));
      }
      try {
        wait_for(POLLOUT, best_effort ? Deadline(std::chrono::milliseconds(200)) : deadline,
                 "in the TLS handshake");
      } catch (const Error& e) {
        if (best_effort) return;
        refuse(e.what());
      }
    }
  };
  if (server) {
    SSL_set_accept_state(ssl_);
  } else {
    SSL_set_connect_state(ssl_);
  }
  ERR_clear_error();
  bool handshaken = false;
  while (true) {
    // TLS 1.3 ends the client's handshake before the server has checked the client's
    // certificate; its verdict (an alert) comes after. Every protocol here has the server speak
    // first (the job-token hello), so the client waits for that first byte: a refusal is then
    // this handshake's error, naming its reason, instead of a failure of the next read.
    int rc;
    if (!handshaken) {
      rc = SSL_do_handshake(ssl_);
      flush_all(rc != 1 && SSL_get_error(ssl_, rc) != SSL_ERROR_WANT_READ);
      if (rc == 1) {
        if (server || !server_speaks_first) return;
        handshaken = true;
        continue;
      }
    } else {
      uint8_t first = 0;
      size_t got = 0;
      rc = SSL_peek_ex(ssl_, &first, 1, &got);
      if (rc == 1) return;
    }
    const int err = SSL_get_error(ssl_, rc);
    if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
      try {
        wait_for(err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT, deadline, "in the TLS handshake");
      } catch (const Error& e) {
        refuse(e.what());
      }
      continue;
    }
    const std::string reason = take_openssl_error(
        err == SSL_ERROR_SYSCALL && errno != 0 ? std::strerror(errno) : "connection closed");
    refuse(handshake_failure(ssl_, err, reason, server));
  }
}

short Socket::events_wanted(short usual) const {
  return ssl_ != nullptr && tls_want_ != 0 ? tls_want_ : usual;
}

std::string Socket::error_text(int err) const {
  if (err == EPROTO && ssl_ != nullptr && !tls_error_.empty()) return "TLS: " + tls_error_;
  return std::strerror(err);
}

long Socket::try_sendv(const iovec* iov, int parts) {
  if (ssl_ == nullptr) {
    msghdr msg{};
    msg.msg_iov = const_cast<iovec*>(iov);
    msg.msg_iovlen = static_cast<size_t>(parts);
    return ::sendmsg(fd_, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  // The ciphertext of earlier calls goes first; its plaintext is reported once it has left (the
  // caller offers the same bytes again after EAGAIN, so the count applies to them).
  OutBuffer& out = out_buffer(ssl_);
  auto flushed = [&]() -> long {
    const int f = flush_out(fd_, out);
    if (f == 1) {
      tls_want_ = 0;
      return 1;
    }
    if (f == 0) {
      tls_want_ = POLLOUT;
      errno = EAGAIN;
    } else {
      tls_error_.clear();
    }
    return -1;
  };
  if (out.unreported > 0 || out.pending() > 0) {
    if (flushed() < 0) return -1;
    const size_t done = out.unreported;
    out.unreported = 0;
    if (done > 0) return static_cast<long>(done);
  }
  // Several pieces: the small ones go out together, copied into one buffer; a large piece after
  // a small one waits for the next call.
  const void* data = iov[0].iov_base;
  size_t n = iov[0].iov_len;
  thread_local std::vector<uint8_t> gather;
  if (parts > 1) {
    size_t total = 0;
    for (int i = 0; i < parts; ++i) total += iov[i].iov_len;
    if (total <= (size_t{64} << 10)) {
      gather.resize(total);
      size_t at = 0;
      for (int i = 0; i < parts; ++i) {
        std::memcpy(gather.data() + at, iov[i].iov_base, iov[i].iov_len);
        at += iov[i].iov_len;
      }
      data = gather.data();
      n = total;
    }
  }
  n = std::min(n, kWriteChunk);
  size_t written = 0;
  const int rc = SSL_write_ex(ssl_, data, n, &written);
  if (rc != 1) {
    const int err = SSL_get_error(ssl_, rc);
    const int sys = errno;
    tls_error_ = take_openssl_error(sys != 0 ? std::strerror(sys) : "connection closed");
    errno = err == SSL_ERROR_SYSCALL && sys != 0 ? sys : EPROTO;
    return -1;
  }
  out.unreported = written;
  if (flushed() < 0) return -1;
  out.unreported = 0;
  return static_cast<long>(written);
}

long Socket::try_recv(void* data, size_t n) {
  if (ssl_ == nullptr) return ::recv(fd_, data, n, MSG_DONTWAIT);
  size_t got = 0;
  const int rc = SSL_read_ex(ssl_, data, n, &got);
  if (rc == 1) {
    tls_want_ = 0;
    return static_cast<long>(got);
  }
  const int err = SSL_get_error(ssl_, rc);
  if (err == SSL_ERROR_WANT_READ || err == SSL_ERROR_WANT_WRITE) {
    tls_want_ = err == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
    errno = EAGAIN;
    return -1;
  }
  if (err == SSL_ERROR_ZERO_RETURN) return 0;  // close_notify
  const int sys = errno;
  if (err == SSL_ERROR_SYSCALL && ERR_peek_error() == 0) {
    // EOF without close_notify is how peers hang up here (nobody sends close_notify), or a
    // system error.
    if (sys == 0 || sys == ECONNRESET) return 0;
    errno = sys;
    return -1;
  }
  tls_error_ = take_openssl_error(sys != 0 ? std::strerror(sys) : "connection closed");
  if (tls_error_ == "unexpected eof while reading") return 0;
  errno = EPROTO;
  return -1;
}

}  // namespace meshtrain::comm
