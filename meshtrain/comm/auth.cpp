// See auth.h for the protocol. HMAC comes from OpenSSL's one-shot HMAC(), comparison from
// CRYPTO_memcmp so that timing reveals nothing about how many bytes of a proof matched.
#include "meshtrain/comm/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <mutex>

#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {
namespace {

constexpr char kMagic[4] = {'M', 'T', 'A', 'U'};
constexpr uint8_t kVersion = 1;
constexpr uint8_t kFlagHasToken = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloBytes = 4 + 1 + 1 + kNonceBytes;
constexpr size_t kProofBytes = 32;
constexpr const char* kLabel = "meshtrain-auth-v1";
// Key used when no token is configured: the handshake still checks the protocol and both
// sides' modes, but proves nothing about identity.
constexpr const char* kNoTokenKey = "meshtrain-no-token";

using Hello = std::array<uint8_t, kHelloBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

Hello make_hello(const AuthToken& token) {
  Hello h{};
  std::memcpy(h.data(), kMagic, 4);
  h[4] = kVersion;
  h[5] = token.empty() ? 0 : kFlagHasToken;
  if (RAND_bytes(h.data() + 6, kNonceBytes) != 1) {
    MT_THROW(AuthError, "cannot draw a random nonce (RAND_bytes failed)");
  }
  return h;
}

// Returns an empty string when the hello is well formed, otherwise why it is not.
std::string check_hello(const Hello& h) {
  if (std::memcmp(h.data(), kMagic, 4) != 0) return "not a meshtrain peer (bad handshake magic)";
  if (h[4] != kVersion) return detail::str_cat("unsupported handshake version ", int(h[4]));
  if ((h[5] & ~kFlagHasToken) != 0) return "unknown handshake flags";
  return {};
}

Proof compute_proof(const AuthToken& token, const char* role, const Hello& client,
                    const Hello& server) {
  std::string msg = kLabel;
  msg.push_back('\0');
  msg.append(role);
  msg.push_back('\0');
  msg.append(reinterpret_cast<const char*>(client.data()), client.size());
  msg.append(reinterpret_cast<const char*>(server.data()), server.size());
  const std::string& key = token.empty() ? std::string(kNoTokenKey) : token.secret();
  Proof out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(),
           &len) == nullptr ||
      len != kProofBytes) {
    MT_THROW(AuthError, "HMAC-SHA256 computation failed");
  }
  return out;
}

bool proofs_equal(const Proof& a, const Proof& b) {
  return CRYPTO_memcmp(a.data(), b.data(), kProofBytes) == 0;
}

std::string strip_trailing_whitespace(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '\n' || s.back() == '\r' ||
                        s.back() == '\t' || s.back() == '\v' || s.back() == '\f')) {
    s.pop_back();
  }
  return s;
}

}  // namespace

AuthToken AuthToken::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) MT_THROW(IoError, "cannot read token file ", path);
  std::string contents;
  contents.resize(kMaxTokenBytes + 1);
  in.read(contents.data(), static_cast<std::streamsize>(contents.size()));
  contents.resize(static_cast<size_t>(in.gcount()));
  if (contents.size() > kMaxTokenBytes) {
    MT_THROW(ValueError, "token file ", path, " is larger than ", kMaxTokenBytes, " bytes");
  }
  contents = strip_trailing_whitespace(std::move(contents));
  if (contents.empty()) MT_THROW(ValueError, "token file ", path, " is empty");
  return AuthToken(std::move(contents));
}

AuthToken AuthToken::from_env() {
  if (const auto t = env_value(Env::token)) {
    std::string s = strip_trailing_whitespace(*t);
    if (s.size() > kMaxTokenBytes) {
      MT_THROW(ValueError, "MESHTRAIN_TOKEN is longer than ", kMaxTokenBytes, " bytes");
    }
    return AuthToken(std::move(s));
  }
  if (const auto f = env_value(Env::token_file)) {
    return from_file(*f);
  }
  return AuthToken();
}

std::string generate_token() {
  std::array<uint8_t, 32> raw{};
  if (RAND_bytes(raw.data(), static_cast<int>(raw.size())) != 1) {
    MT_THROW(AuthError, "cannot generate a job token (RAND_bytes failed)");
  }
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(raw.size() * 2);
  for (uint8_t b : raw) {
    out.push_back(kHex[b >> 4]);
    out.push_back(kHex[b & 15]);
  }
  return out;
}

void authenticate_client(Socket& socket, const AuthToken& token, const Deadline& deadline) {
  const std::string peer = socket.peer();
  try {
    Hello mine = make_hello(token);
    socket.send_all(mine.data(), mine.size(), deadline);
    Hello theirs{};
    socket.recv_all(theirs.data(), theirs.size(), deadline);
    if (std::string why = check_hello(theirs); !why.empty()) {
      MT_THROW(AuthError, "handshake with ", peer, " failed: ", why);
    }
    bool they_have_token = (theirs[5] & kFlagHasToken) != 0;
    if (they_have_token && token.empty()) {
      MT_THROW(AuthError, "server ", peer,
               " requires a job token but none is configured (set MESHTRAIN_TOKEN or "
               "MESHTRAIN_TOKEN_FILE)");
    }
    if (!they_have_token && !token.empty()) {
      MT_THROW(AuthError, "server ", peer, " has no job token but this process has one");
    }
    Proof proof = compute_proof(token, "client", mine, theirs);
    socket.send_all(proof.data(), proof.size(), deadline);
    Proof server_proof{};
    try {
      socket.recv_all(server_proof.data(), server_proof.size(), deadline);
    } catch (const CommError&) {
      MT_THROW(AuthError, "server ", peer, " refused the job token (connection closed)");
    }
    if (!proofs_equal(server_proof, compute_proof(token, "server", mine, theirs))) {
      MT_THROW(AuthError, "server ", peer, " failed to prove knowledge of the job token");
    }
  } catch (const AuthError&) {
    socket.close();
    throw;
  } catch (const Error& e) {
    socket.close();
    MT_THROW(AuthError, "handshake with ", peer, " failed: ", e.what());
  }
}

namespace {

struct RefusalLog {
  std::mutex mu;
  std::chrono::milliseconds interval{10000};
  std::chrono::steady_clock::time_point last{};
  bool logged = false;
  int64_t unlogged = 0;  // refusals since the last line
};

RefusalLog& refusal_log() {
  static RefusalLog r;
  return r;
}

// The first refusal of an interval is logged with the number refused since the last line.
void log_refusal(const std::string& peer, const std::string& why) {
  RefusalLog& r = refusal_log();
  std::lock_guard lock(r.mu);
  const auto now = std::chrono::steady_clock::now();
  if (r.logged && now - r.last < r.interval) {
    ++r.unlogged;
    return;
  }
  const std::string more =
      r.unlogged > 0 ? detail::str_cat(" (and ", r.unlogged, " refused since the last such line)")
                     : "";
  MT_LOG_WARN("auth", "refused connection from ", peer, ": ", why, more);
  r.logged = true;
  r.last = now;
  r.unlogged = 0;
}

}  // namespace

void authenticate_server(Socket& socket, const AuthToken& token, const Deadline& deadline) {
  const std::string peer = socket.peer();
  std::string why;
  try {
    Hello mine = make_hello(token);
    socket.send_all(mine.data(), mine.size(), deadline);
    Hello theirs{};
    socket.recv_all(theirs.data(), theirs.size(), deadline);
    why = check_hello(theirs);
    if (why.empty()) {
      bool they_have_token = (theirs[5] & kFlagHasToken) != 0;
      if (they_have_token != !token.empty()) {
        why = they_have_token ? "client has a job token but this server has none"
                              : "client has no job token";
      }
    }
    if (why.empty()) {
      Proof client_proof{};
      socket.recv_all(client_proof.data(), client_proof.size(), deadline);
      if (!proofs_equal(client_proof, compute_proof(token, "client", theirs, mine))) {
        why = "wrong job token";
      } else {
        Proof proof = compute_proof(token, "server", theirs, mine);
        socket.send_all(proof.data(), proof.size(), deadline);
        return;
      }
    }
  } catch (const Error& e) {
    why = e.what();
  }
  socket.close();
  log_refusal(peer, why);
  MT_THROW(AuthError, "refused connection from ", peer, ": ", why);
}

void set_refusal_log_interval(std::chrono::milliseconds interval) {
  RefusalLog& r = refusal_log();
  std::lock_guard lock(r.mu);
  r.interval = interval;
}

}  // namespace meshtrain::comm
