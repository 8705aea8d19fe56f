// See etcd_store.h. The JSON gateway encodes keys and values in base64 and 64-bit integers as
// strings, and leaves out every field that holds its default (an empty value, "succeeded":
// false, a zero count), so each reader below treats a missing field as that default.
#include "meshtrain/comm/etcd_store.h"

#include <httplib.h>
#include <openssl/evp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "meshtrain/comm/auth.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A watch is re-created at least this often, so that a member that vanished without closing
// the connection is noticed and the next member takes over.
constexpr auto kWatchSlice = 5s;
constexpr auto kFirstBackoff = 20ms;
constexpr auto kMaxBackoff = 1s;
// etcd's default limit on operations in one transaction is 128.
constexpr size_t kMaxTxnOps = 64;
// The per-handle record that makes add() exact across a failover (see etcd_store.h).
constexpr const char* kAddMarkers = "__add_seq/";

std::string b64(const std::string& raw) {
  std::string out(4 * ((raw.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(raw.data()),
                          static_cast<int>(raw.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::string b64(const Bytes& raw) {
  return b64(std::string(raw.begin(), raw.end()));
}

Bytes unb64(const std::string& text) {
  if (text.empty()) return {};
  if (text.size() % 4 != 0) MT_THROW(StoreError, "etcd sent malformed base64 (", text.size(), ")");
  Bytes out(text.size() / 4 * 3 + 1);
  int n = EVP_DecodeBlock(out.data(), reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0) MT_THROW(StoreError, "etcd sent malformed base64");
  size_t pad = 0;
  for (size_t i = text.size(); i > 0 && text[i - 1] == '=' && pad < 2; --i) ++pad;
  out.resize(static_cast<size_t>(n) - pad);
  return out;
}

int64_t json_int(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || it->is_null()) return 0;
  if (it->is_number_integer()) return it->get<int64_t>();
  if (it->is_string()) return std::strtoll(it->get<std::string>().c_str(), nullptr, 10);
  return 0;
}

bool json_bool(const json& j, const char* field) {
  auto it = j.find(field);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

std::string json_str(const json& j, const char* field) {
  auto it = j.find(field);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

// One key as a range answer shows it.
struct Kv {
  bool found = false;
  Bytes value;
  int64_t mod_revision = 0;
};

Kv first_kv(const json& range_response) {
  Kv kv;
  auto kvs = range_response.find("kvs");
  if (kvs != range_response.end() && kvs->is_array() && !kvs->empty()) {
    const json& k = kvs->front();
    kv.found = true;
    kv.value = unb64(json_str(k, "value"));
    kv.mod_revision = json_int(k, "mod_revision");
  }
  return kv;
}

// The key read by the idx-th range operation of a transaction's answer.
Kv txn_range(const json& txn_response, size_t idx) {
  auto responses = txn_response.find("responses");
  if (responses == txn_response.end() || !responses->is_array() || responses->size() <= idx) {
    MT_THROW(StoreError, "etcd answered a transaction without the expected responses");
  }
  auto range = (*responses)[idx].find("response_range");
  if (range == (*responses)[idx].end()) MT_THROW(StoreError, "etcd answered without a range");
  return first_kv(*range);
}

int64_t header_revision(const json& response) {
  auto h = response.find("header");
  return h == response.end() ? 0 : json_int(*h, "revision");
}

json range_op(const std::string& full_key, bool keys_only) {
  json r = json::object();
  r["key"] = b64(full_key);
  if (keys_only) r["keys_only"] = true;
  json op = json::object();
  op["request_range"] = std::move(r);
  return op;
}

json put_op(const std::string& full_key, const Bytes& value) {
  json p = json::object();
  p["key"] = b64(full_key);
  p["value"] = b64(value);
  json op = json::object();
  op["request_put"] = std::move(p);
  return op;
}

// The "host:port" shown in messages, and the URL given to the HTTP client.
std::string display_endpoint(const std::string& e) {
  auto p = e.find("://");
  return p == std::string::npos ? e : e.substr(p + 3);
}

std::string endpoint_url(const std::string& e) {
  return e.find("://") == std::string::npos ? "http://" + e : e;
}

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  size_t e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// The message of an error answer from the gateway: {"error": "...", "message": "...", "code": N}
// for unary calls, {"error": {"message": ..., "grpc_code": N}} inside a stream.
std::string error_message(const json& j) {
  std::string m = json_str(j, "message");
  if (m.empty()) m = json_str(j, "error");
  auto e = j.find("error");
  if (m.empty() && e != j.end() && e->is_object()) m = json_str(*e, "message");
  return m.empty() ? j.dump() : m;
}

}  // namespace

EtcdStoreOptions EtcdStoreOptions::from_env() {
  EtcdStoreOptions o;
  if (auto v = env_value(Env::etcd_user)) o.username = *v;
  if (auto v = env_value(Env::etcd_password)) {
    o.password = *v;
  } else if (auto f = env_value(Env::etcd_password_file)) {
    std::ifstream in(*f);
    if (!in) MT_THROW(ValueError, "cannot read MESHTRAIN_ETCD_PASSWORD_FILE '", *f, "'");
    std::stringstream ss;
    ss << in.rdbuf();
    o.password = trim(ss.str());
  }
  if (!o.username.empty() && o.password.empty()) {
    MT_THROW(ValueError,
             "MESHTRAIN_ETCD_USER is set but neither MESHTRAIN_ETCD_PASSWORD nor "
             "MESHTRAIN_ETCD_PASSWORD_FILE gives a password");
  }
  if (auto v = env_value(Env::etcd_cacert)) o.ca_file = *v;
  if (auto v = env_value(Env::etcd_cert)) o.cert_file = *v;
  if (auto v = env_value(Env::etcd_key)) o.key_file = *v;
  return o;
}

std::vector<std::string> parse_etcd_endpoints(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream in(list);
  std::string item;
  while (std::getline(in, item, ',')) {
    item = trim(item);
    if (item.empty()) {
      MT_THROW(ValueError, "etcd endpoint list '", list, "' has an empty entry");
    }
    if (display_endpoint(item).find(':') == std::string::npos) {
      MT_THROW(ValueError, "etcd endpoint '", item, "' needs a port (HOST:PORT)");
    }
    out.push_back(item);
  }
  if (out.empty()) MT_THROW(ValueError, "no etcd endpoint given (HOST:PORT[,HOST:PORT...])");
  return out;
}

std::string etcd_job_prefix(const std::string& rdzv_id) {
  if (rdzv_id.empty()) MT_THROW(ValueError, "the etcd rendezvous needs a job id (--rdzv-id)");
  return "meshtrain/" + rdzv_id + "/";
}

struct EtcdStore::Impl {
  const EtcdStoreOptions& options;
  Store& owner;  // for its current timeout
  std::mutex mu;
  size_t current = 0;  // the member that answered last
  std::vector<std::unique_ptr<httplib::Client>> clients;
  std::string auth_token;
  std::string handle_id = generate_token().substr(0, 16);
  std::atomic<uint64_t> add_seq{0};

  Impl(const EtcdStoreOptions& o, Store& s) : options(o), owner(s), clients(o.endpoints.size()) {}

  std::string member(size_t i) const { return display_endpoint(options.endpoints[i]); }

  std::string all_members() const {
    std::string s;
    for (size_t i = 0; i < options.endpoints.size(); ++i) s += (i ? ", " : "") + member(i);
    return s;
  }

  std::unique_ptr<httplib::Client> make_client(size_t i, Duration read_timeout) const {
    const std::string url = endpoint_url(options.endpoints[i]);
    auto c = options.cert_file.empty()
                 ? std::make_unique<httplib::Client>(url)
                 : std::make_unique<httplib::Client>(url, options.cert_file, options.key_file);
    if (!c->is_valid())
      MT_THROW(ValueError, "etcd endpoint '", options.endpoints[i], "' is invalid");
    // Requests go out as headers then body: without TCP_NODELAY each one waits out a delayed ACK.
    c->set_tcp_nodelay(true);
    c->set_connection_timeout(options.connect_timeout);
    c->set_read_timeout(read_timeout);
    c->set_write_timeout(options.request_timeout);
    if (!options.ca_file.empty()) c->set_ca_cert_path(options.ca_file.c_str());
    return c;
  }

  httplib::Headers headers_locked() const {
    httplib::Headers h;
    if (!auth_token.empty()) h.emplace("Authorization", auth_token);
    return h;
  }

  // Logs in on member i. Returns an error text when the member cannot be reached; throws
  // AuthError when it refuses the credentials.
  std::optional<std::string> authenticate_locked(size_t i) {
    json body = {{"name", options.username}, {"password", options.password}};
    auto res = clients[i]->Post("/v3/auth/authenticate", body.dump(), "application/json");
    if (!res) return httplib::to_string(res.error());
    json j = json::parse(res->body, nullptr, false);
    if (res->status != 200 || j.is_discarded() || json_str(j, "token").empty()) {
      if (res->status >= 500) return detail::str_cat("HTTP ", res->status);
      MT_THROW(AuthError, "etcd at ", member(i), " refused user '", options.username,
               "': ", j.is_discarded() ? res->body : error_message(j));
    }
    auth_token = json_str(j, "token");
    return std::nullopt;
  }

  // One unary request, tried on each member in turn (starting with the one that answered
  // last) until one answers, for up to the store timeout.
  json call(const std::string& path, const json& body) {
    const std::string payload = body.dump();
    const Duration budget = owner.timeout();
    const auto deadline = Clock::now() + budget;
    const size_t n = clients.size();
    std::vector<std::string> errors(n);
    Duration backoff = kFirstBackoff;
    bool reauthenticated = false;
    while (true) {
      {
        std::lock_guard lock(mu);
        for (size_t tried = 0; tried < n;) {
          const size_t i = (current + tried) % n;
          if (!clients[i]) {
            clients[i] = make_client(i, options.request_timeout);
            clients[i]->set_keep_alive(true);
          }
          if (!options.username.empty() && auth_token.empty()) {
            if (auto err = authenticate_locked(i)) {
              errors[i] = *err;
              clients[i].reset();
              ++tried;
              continue;
            }
          }
          auto res = clients[i]->Post(path, headers_locked(), payload, "application/json");
          if (!res) {
            errors[i] = httplib::to_string(res.error());
            clients[i].reset();
            ++tried;
            continue;
          }
          json j = json::parse(res->body, nullptr, false);
          if (res->status == 200 && !j.is_discarded()) {
            current = i;
            return j;
          }
          const std::string msg = j.is_discarded() ? res->body : error_message(j);
          const int64_t code = j.is_discarded() ? 0 : json_int(j, "code");
          // gRPC UNAUTHENTICATED: the token expired (or another member restarted); log in again.
          if (code == 16 && !options.username.empty() && !reauthenticated) {
            auth_token.clear();
            reauthenticated = true;
            continue;
          }
          // UNAVAILABLE, DEADLINE_EXCEEDED or a gateway failure: this member cannot serve now
          // (no leader, lost quorum on its side); another one may.
          if (res->status >= 500 || code == 14 || code == 4) {
            errors[i] = detail::str_cat("HTTP ", res->status, ": ", msg);
            clients[i].reset();
            ++tried;
            continue;
          }
          if (code == 16 || code == 7) MT_THROW(AuthError, "etcd at ", member(i), ": ", msg);
          MT_THROW(StoreError, "etcd at ", member(i), " rejected ", path, ": ", msg);
        }
        // Every member failed: start with the next one after a pause.
        current = (current + 1) % n;
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        std::string why;
        for (size_t i = 0; i < n; ++i) why += (i ? "; " : "") + member(i) + ": " + errors[i];
        MT_THROW(CommError, "cannot reach etcd at ", all_members(), " within ", budget.count(),
                 " ms: ", why);
      }
      std::this_thread::sleep_for(std::min<Clock::duration>(backoff, deadline - now));
      backoff = std::min<Duration>(backoff * 2, kMaxBackoff);
    }
  }

  json txn(const json& compare, const json& success, const json& failure) {
    return call("/v3/kv/txn", {{"compare", compare}, {"success", success}, {"failure", failure}});
  }

  // The key and the revision at which it was read.
  std::pair<Kv, int64_t> range(const std::string& full_key, bool keys_only) {
    json body = {{"key", b64(full_key)}};
    if (keys_only) body["keys_only"] = true;
    json r = call("/v3/kv/range", body);
    return {first_kv(r), header_revision(r)};
  }

  // Returns once full_key may have changed after `revision`, at the deadline, or after a slice
  // of kWatchSlice; the caller reads the key again either way.
  void watch(const std::string& full_key, int64_t revision, Clock::time_point deadline) {
    const auto start = Clock::now();
    if (start >= deadline) return;
    const auto slice = std::chrono::duration_cast<Duration>(
        std::min<Clock::duration>(deadline - start, kWatchSlice));
    size_t i;
    httplib::Headers headers;
    {
      std::lock_guard lock(mu);
      i = current;
      headers = headers_locked();
    }
    // A client of its own, so that a long watch does not hold up this handle's other requests.
    auto client = make_client(i, std::max<Duration>(slice, 1ms));
    httplib::Request req;
    req.method = "POST";
    req.path = "/v3/watch";
    req.headers = headers;
    req.set_header("Content-Type", "application/json");
    req.body = json{{"create_request",
                     {{"key", b64(full_key)}, {"start_revision", std::to_string(revision + 1)}}}}
                   .dump();
    std::string buffer;
    bool changed = false;
    req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
      buffer.append(data, len);
      for (size_t nl; (nl = buffer.find('\n')) != std::string::npos;) {
        json j = json::parse(buffer.substr(0, nl), nullptr, false);
        buffer.erase(0, nl + 1);
        if (j.is_discarded()) continue;
        auto r = j.find("result");
        // Events, a cancelled watch (compaction) or an error: read the key again.
        if (r == j.end() || !r->is_object()) return false;
        auto events = r->find("events");
        if ((events != r->end() && events->is_array() && !events->empty()) ||
            json_bool(*r, "canceled")) {
          changed = true;
          return false;
        }
      }
      return true;
    };
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    client->send(req, res, err);
    if (changed) return;
    // The stream ended early (a member that went away, an error answer): pause briefly so that
    // a persistent failure does not spin, then let the caller's read fail over.
    if (Clock::now() - start < slice / 2) {
      std::this_thread::sleep_for(std::min<Clock::duration>(100ms, deadline - Clock::now()));
    }
  }

  // Blocks until full_key exists; returns its value.
  std::optional<Bytes> wait_for(const std::string& full_key, Clock::time_point deadline,
                                bool keys_only) {
    while (true) {
      auto [kv, revision] = range(full_key, keys_only);
      if (kv.found) return kv.value;
      if (Clock::now() >= deadline) return std::nullopt;
      watch(full_key, revision, deadline);
    }
  }
};

EtcdStore::EtcdStore(EtcdStoreOptions options) : options_(std::move(options)) {
  if (options_.endpoints.empty()) MT_THROW(ValueError, "EtcdStore needs at least one endpoint");
  if (options_.cert_file.empty() != options_.key_file.empty()) {
    MT_THROW(ValueError, "an etcd client certificate needs both a certificate and a key file");
  }
  timeout_ = options_.timeout;
  impl_ = std::make_unique<Impl>(options_, *this);
}

EtcdStore::~EtcdStore() = default;

void EtcdStore::set(const std::string& key, const Bytes& value) {
  impl_->call("/v3/kv/put", {{"key", b64(prefix() + key)}, {"value", b64(value)}});
}

Bytes EtcdStore::get(const std::string& key) {
  auto value = impl_->wait_for(prefix() + key, Clock::now() + timeout_, false);
  if (!value) throw TimeoutError(missing_keys_message({key}, timeout_));
  return std::move(*value);
}

int64_t EtcdStore::add(const std::string& key, int64_t delta) {
  const std::string full = prefix() + key;
  const std::string marker = prefix() + kAddMarkers + impl_->handle_id;
  const Bytes seq = format_store_integer(static_cast<int64_t>(++impl_->add_seq));
  Kv kv = impl_->range(full, false).first;
  while (true) {
    const int64_t result = (kv.found ? parse_store_integer(key, kv.value) : 0) + delta;
    json compare = json::object();
    compare["target"] = "MOD";
    compare["key"] = b64(full);
    compare["mod_revision"] = std::to_string(kv.mod_revision);
    compare["result"] = "EQUAL";
    json success = json::array();
    success.push_back(put_op(full, format_store_integer(result)));
    success.push_back(put_op(marker, seq));
    json failure = json::array();
    failure.push_back(range_op(full, false));
    failure.push_back(range_op(marker, false));
    json r = impl_->txn(json::array({compare}), success, failure);
    if (json_bool(r, "succeeded")) return result;
    const Kv now = txn_range(r, 0);
    const Kv mark = txn_range(r, 1);
    // An earlier try of this very transaction committed on a member whose answer was lost.
    if (mark.found && mark.value == seq) return result;
    kv = now;
  }
}

Bytes EtcdStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  const std::string full = prefix() + key;
  json compare = json::object();
  compare["key"] = b64(full);
  compare["result"] = "EQUAL";
  if (expected.empty()) {
    compare["target"] = "CREATE";
    compare["create_revision"] = "0";
  } else {
    compare["target"] = "VALUE";
    compare["value"] = b64(expected);
  }
  json success = json::array();
  success.push_back(put_op(full, desired));
  json failure = json::array();
  failure.push_back(range_op(full, false));
  json r = impl_->txn(json::array({compare}), success, failure);
  if (json_bool(r, "succeeded")) return desired;
  return txn_range(r, 0).value;
}

void EtcdStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  const auto deadline = Clock::now() + timeout;
  for (size_t k = 0; k < keys.size(); ++k) {
    if (impl_->wait_for(prefix() + keys[k], deadline, true)) continue;
    std::vector<std::string> missing = {keys[k]};
    for (size_t m = k + 1; m < keys.size(); ++m) {
      if (!check({keys[m]})) missing.push_back(keys[m]);
    }
    throw TimeoutError(missing_keys_message(missing, timeout));
  }
}

bool EtcdStore::remove(const std::string& key) {
  json r = impl_->call("/v3/kv/deleterange", {{"key", b64(prefix() + key)}});
  return json_int(r, "deleted") > 0;
}

bool EtcdStore::check(const std::vector<std::string>& keys) {
  // One transaction per batch of keys: a consistent answer in one round trip.
  for (size_t begin = 0; begin < keys.size(); begin += kMaxTxnOps) {
    json ops = json::array();
    for (size_t k = begin; k < std::min(keys.size(), begin + kMaxTxnOps); ++k) {
      ops.push_back(range_op(prefix() + keys[k], true));
    }
    json r = impl_->txn(json::array(), ops, json::array());
    for (size_t k = 0; k < ops.size(); ++k) {
      if (!txn_range(r, k).found) return false;
    }
  }
  return true;
}

}  // namespace meshtrain::comm
