// Job authentication: every store client and every peer connection proves that it knows the
// job's secret token before any other byte is accepted. The proof is a mutual HMAC-SHA256
// challenge-response over fresh nonces, so the token never crosses the wire and a recorded
// handshake cannot be replayed. Without a token both sides still run the handshake, flagged as
// "no token", so that a server with a token refuses a client without one and the reverse.
//
// Wire format (all sizes fixed, so nothing read from the peer decides an allocation):
//   hello  = "MTAU" | version u8 | flags u8 (bit 0: token configured) | nonce[32]   (both sides)
//   proof  = HMAC-SHA256(token, label | role | client hello | server hello)         (32 bytes)
// The client sends its proof first; the server answers with its own proof only after the
// client's proof verified, so an unauthenticated client learns nothing from the server.
#pragma once

#include <chrono>

#include <optional>
#include <string>

#include "meshtrain/comm/socket.h"

namespace meshtrain::comm {

// The job's shared secret; an empty secret means "no token configured".
class AuthToken {
 public:
  AuthToken() = default;
  explicit AuthToken(std::string secret) : secret_(std::move(secret)) {}

  // MESHTRAIN_TOKEN, else the contents of the file named by MESHTRAIN_TOKEN_FILE (trailing
  // whitespace stripped), else no token. A token file that is missing, empty or larger than
  // kMaxTokenBytes is an error.
  static AuthToken from_env();
  static AuthToken from_file(const std::string& path);

  bool empty() const { return secret_.empty(); }
  const std::string& secret() const { return secret_; }

  static constexpr size_t kMaxTokenBytes = 4096;

 private:
  std::string secret_;
};

// 32 random bytes from the OpenSSL CSPRNG, as 64 lowercase hex characters.
std::string generate_token();

// Runs the handshake on a freshly connected socket. On failure the socket is closed and
// AuthError is thrown; the server side also logs a line naming the peer address, at most one per
// interval (10 s): the refusals in between are counted and the next line gives their number, so a
// scanner or a misconfigured job cannot flood the log.
void authenticate_client(Socket& socket, const AuthToken& token, const Deadline& deadline);
void authenticate_server(Socket& socket, const AuthToken& token, const Deadline& deadline);

// The interval of the refusal lines (tests).
void set_refusal_log_interval(std::chrono::milliseconds interval);

}  // namespace meshtrain::comm
