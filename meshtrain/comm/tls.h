// TLS in transit: the store (client and server) and the tcp transport of the collectives speak
// TLS 1.3 through OpenSSL when it is on, with mutual certificates: each side presents its node's
// certificate and verifies the peer's against the job's CA, validity dates included. A peer whose
// certificate comes from another CA, has expired, or that speaks plaintext is refused with one
// line naming its address. Identity beyond "holds a certificate of our CA" is not checked (no
// host-name match: peers are dialled by the addresses they announce in the store); the job token's
// HMAC handshake (auth.h) still runs inside the TLS session.
//
// Where the settings come from: MESHTRAIN_TLS=1 with MESHTRAIN_TLS_CERT, MESHTRAIN_TLS_KEY and
// MESHTRAIN_TLS_CA (meshrun --tls-* sets them for the store it hosts and for its workers), or a
// training config's dist.tls, dist.tls_cert, dist.tls_key, dist.tls_ca, which the worker installs
// with set_default_tls() before it reaches the store. Socket::start_tls runs the handshake; after
// it every byte of that socket goes through the session (socket.h).
//
// The development CA and node certificates come from generate_ca / generate_cert (OpenSSL's C
// API; `meshtrain tls gen-ca` and `meshtrain tls gen-cert` on the command line): EC P-256 keys,
// SHA-256 signatures, the node certificate good for both client and server authentication.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

struct ssl_ctx_st;

namespace meshtrain::comm {

struct TlsSettings {
  bool enabled = false;
  std::string cert, key, ca;
  // Where each value came from, for error messages: "dist.tls_cert", "MESHTRAIN_TLS_CERT", ...
  std::string cert_from = "MESHTRAIN_TLS_CERT";
  std::string key_from = "MESHTRAIN_TLS_KEY";
  std::string ca_from = "MESHTRAIN_TLS_CA";
  std::string enabled_from = "MESHTRAIN_TLS";

  // MESHTRAIN_TLS (1/true/yes/on) and the three paths. ValueError on a bad MESHTRAIN_TLS.
  static TlsSettings from_env();
};

// An SSL_CTX for both roles: TLS 1.3 only, AES-GCM first, the node's certificate and key, the
// CA that verifies peers, and peer verification required in both directions. Immutable after
// load, shared by every connection of the process.
class TlsContext {
 public:
  // Throws ValueError with one line naming the setting and the file when a file is missing,
  // unreadable, not PEM, or the key does not match the certificate.
  static std::shared_ptr<const TlsContext> load(const TlsSettings& settings);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  ssl_ctx_st* native() const { return ctx_; }
  // The subject of this node's certificate, for log lines.
  const std::string& subject() const { return subject_; }

 private:
  TlsContext() = default;
  ssl_ctx_st* ctx_ = nullptr;
  std::string subject_;
};

// The process's TLS: what set_default_tls installed, else loaded once from the environment
// (null when MESHTRAIN_TLS is off). Every store and tcp transport whose options leave `tls`
// unset uses it.
std::shared_ptr<const TlsContext> default_tls();
void set_default_tls(std::shared_ptr<const TlsContext> tls);

// Certificate generation. Validity runs from now + not_before_s to now + not_after_s (seconds,
// negative in the past: a test makes an expired certificate with both negative).
struct CertOptions {
  std::string common_name;
  std::vector<std::string> hosts;  // subjectAltName entries: IP addresses or DNS names
  int64_t not_before_s = -3600;
  int64_t not_after_s = int64_t{365} * 86400;
};
// A self-signed CA certificate and its key, written as PEM (the key with mode 0600).
void generate_ca(const std::string& cert_path, const std::string& key_path,
                 const CertOptions& options);
// A node certificate signed by the CA in ca_cert_path/ca_key_path.
void generate_cert(const std::string& ca_cert_path, const std::string& ca_key_path,
                   const std::string& cert_path, const std::string& key_path,
                   const CertOptions& options);

}  // namespace meshtrain::comm
