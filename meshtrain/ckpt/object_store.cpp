// See object_store.h. One libcurl easy handle per thread (kept for the thread's life, so that
// its connection is reused); libcurl signs every request (CURLOPT_AWS_SIGV4) with the payload
// declared UNSIGNED-PAYLOAD: the body is checked by Content-MD5 instead, which the server
// verifies and answers as the ETag.
#include "meshtrain/ckpt/object_store.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/md5.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "meshtrain/util/env_registry.h"

namespace meshtrain::ckpt {
namespace {

namespace fs = std::filesystem;

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::string(v) : std::string();
}

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  const auto e = s.find_last_not_of(" \t\r\n");
  return s.substr(b, e - b + 1);
}

// RFC 3986 unreserved characters pass; '/' too when it separates the key's segments.
std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string xml_unescape(std::string s) {
  const std::pair<const char*, const char*> map[] = {
      {"&quot;", "\""}, {"&apos;", "'"}, {"&lt;", "<"}, {"&gt;", ">"}, {"&amp;", "&"}};
  for (const auto& [from, to] : map) {
    size_t pos = 0;
    while ((pos = s.find(from, pos)) != std::string::npos) {
      s.replace(pos, std::strlen(from), to);
      pos += std::strlen(to);
    }
  }
  return s;
}

// The text of the first <tag>...</tag> at or after `from` (advanced past it), or nothing.
std::optional<std::string> xml_tag(const std::string& xml, const std::string& tag,
                                   size_t* from = nullptr) {
  const std::string open = "<" + tag + ">", close = "</" + tag + ">";
  const size_t start = from != nullptr ? *from : 0;
  const size_t b = xml.find(open, start);
  if (b == std::string::npos) return std::nullopt;
  const size_t e = xml.find(close, b + open.size());
  if (e == std::string::npos) return std::nullopt;
  if (from != nullptr) *from = e + close.size();
  return xml_unescape(xml.substr(b + open.size(), e - b - open.size()));
}

std::string strip_quotes(std::string s) {
  s = trim(s);
  if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
  return s;
}

void curl_init_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

// One handle per thread, cleaned up when the thread ends.
struct ThreadHandle {
  CURL* h = nullptr;
  ~ThreadHandle() {
    if (h != nullptr) curl_easy_cleanup(h);
  }
  CURL* get() {
    if (h == nullptr) {
      curl_init_once();
      h = curl_easy_init();
    } else {
      curl_easy_reset(h);
    }
    return h;
  }
};

thread_local ThreadHandle t_handle;

// Reads ~/.aws/credentials-style INI: the keys of [profile].
std::map<std::string, std::string> read_profile(const std::string& path,
                                                const std::string& profile) {
  std::map<std::string, std::string> out;
  std::ifstream in(path);
  if (!in) return out;
  std::string line;
  bool in_profile = false;
  while (std::getline(in, line)) {
    line = trim(line);
    if (line.empty() || line[0] == '#' || line[0] == ';') continue;
    if (line.front() == '[' && line.back() == ']') {
      in_profile = trim(line.substr(1, line.size() - 2)) == profile;
      continue;
    }
    if (!in_profile) continue;
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    out[trim(line.substr(0, eq))] = trim(line.substr(eq + 1));
  }
  return out;
}

std::string base64(const unsigned char* data, size_t n) {
  std::string out(4 * ((n + 2) / 3) + 1, '\0');
  const int len =
      EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()), data, static_cast<int>(n));
  out.resize(static_cast<size_t>(len));
  return out;
}

void md5_raw(const char* data, uint64_t size, unsigned char out[16]) {
  unsigned int len = 0;
  EVP_Digest(data, size, out, &len, EVP_md5(), nullptr);
}

std::string to_hex(const unsigned char* d, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += hex[d[i] >> 4];
    s += hex[d[i] & 15];
  }
  return s;
}

}  // namespace

// ---- URIs and settings ----

std::string ObjectUri::str() const {
  return prefix.empty() ? "s3://" + bucket : "s3://" + bucket + "/" + prefix;
}

std::string ObjectUri::key(const std::string& rel) const {
  return prefix.empty() ? rel : prefix + "/" + rel;
}

bool is_object_uri(const std::string& path) {
  return path.rfind("s3://", 0) == 0;
}

std::string object_cache_root() {
  std::string cache = env_value(Env::s3_cache).value_or("");
  if (!cache.empty()) return cache;
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  return xdg != nullptr && *xdg != '\0'
             ? std::string(xdg) + "/meshtrain/s3"
             : std::string(home != nullptr ? home : "/tmp") + "/.cache/meshtrain/s3";
}

ObjectUri parse_object_uri(const std::string& uri) {
  if (!is_object_uri(uri)) MT_THROW(ValueError, "'", uri, "' is not an s3://bucket/prefix URI");
  std::string rest = uri.substr(5);
  ObjectUri out;
  const auto slash = rest.find('/');
  out.bucket = rest.substr(0, slash);
  if (slash != std::string::npos) out.prefix = rest.substr(slash + 1);
  while (!out.prefix.empty() && out.prefix.back() == '/') out.prefix.pop_back();
  while (!out.prefix.empty() && out.prefix.front() == '/') out.prefix.erase(0, 1);
  if (out.bucket.empty()) MT_THROW(ValueError, "'", uri, "' names no bucket (s3://bucket/prefix)");
  return out;
}

S3Settings S3Settings::from_environment() {
  S3Settings s;
  s.region = env("AWS_REGION");
  if (s.region.empty()) s.region = env("AWS_DEFAULT_REGION");
  if (s.region.empty()) s.region = "us-east-1";
  s.endpoint = env("AWS_ENDPOINT_URL_S3");
  if (s.endpoint.empty()) s.endpoint = env("AWS_ENDPOINT_URL");
  if (s.endpoint.empty()) s.endpoint = "https://s3." + s.region + ".amazonaws.com";
  while (!s.endpoint.empty() && s.endpoint.back() == '/') s.endpoint.pop_back();
  s.access_key = env("AWS_ACCESS_KEY_ID");
  s.secret_key = env("AWS_SECRET_ACCESS_KEY");
  s.session_token = env("AWS_SESSION_TOKEN");
  s.credentials_from = "AWS_ACCESS_KEY_ID";
  if (s.access_key.empty() || s.secret_key.empty()) {
    std::string file = env("AWS_SHARED_CREDENTIALS_FILE");
    if (file.empty() && !env("HOME").empty()) file = env("HOME") + "/.aws/credentials";
    std::string profile = env("AWS_PROFILE");
    if (profile.empty()) profile = "default";
    const auto keys = read_profile(file, profile);
    auto get = [&](const char* k) {
      const auto it = keys.find(k);
      return it == keys.end() ? std::string() : it->second;
    };
    s.access_key = get("aws_access_key_id");
    s.secret_key = get("aws_secret_access_key");
    s.session_token = get("aws_session_token");
    s.credentials_from = file + " [" + profile + "]";
    if (s.access_key.empty() || s.secret_key.empty())
      MT_THROW(ValueError,
               "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or profile '",
               profile, "' in ", file, " (AWS_SHARED_CREDENTIALS_FILE, AWS_PROFILE)");
  }
  return s;
}

std::string md5_hex(const char* data, uint64_t size) {
  unsigned char d[16];
  md5_raw(data, size, d);
  return to_hex(d, 16);
}

std::string md5_base64(const char* data, uint64_t size) {
  unsigned char d[16];
  md5_raw(data, size, d);
  return base64(d, 16);
}

std::string md5_file_hex(int fd, uint64_t offset, uint64_t size, const std::string& what) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), EVP_md5(), nullptr);
  std::vector<char> buf(std::min<uint64_t>(size, uint64_t{4} << 20) + 1);
  for (uint64_t done = 0; done < size;) {
    const ssize_t k = ::pread(fd, buf.data(), std::min<uint64_t>(buf.size(), size - done),
                              static_cast<off_t>(offset + done));
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) MT_THROW(IoError, "cannot read ", what);
    EVP_DigestUpdate(ctx.get(), buf.data(), static_cast<size_t>(k));
    done += static_cast<uint64_t>(k);
  }
  unsigned char digest[16];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx.get(), digest, &len);
  return to_hex(digest, 16);
}

std::string md5_file_hex(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) MT_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
  struct stat st {};
  std::string out;
  try {
    if (::fstat(fd, &st) != 0) MT_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
    out = md5_file_hex(fd, 0, static_cast<uint64_t>(st.st_size), path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  return out;
}

void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  const int t = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::exception_ptr first;
  auto worker = [&] {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (first) return;
      }
      const int64_t i = next.fetch_add(1);
      if (i >= n) return;
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!first) first = std::current_exception();
      }
    }
  };
  if (t == 1) {
    worker();
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < t; ++i) pool.emplace_back(worker);
    for (auto& th : pool) th.join();
  }
  if (first) std::rethrow_exception(first);
}

// ---- requests ----

struct S3ObjectStore::Request {
  std::string method = "GET";  // GET, PUT, POST, HEAD, DELETE
  std::string key;             // empty: the bucket itself
  std::string query;           // encoded, parameters in sorted order (signed as is)
  const char* body = nullptr;  // PUT/POST: memory, or (PUT) body_fd from body_offset
  int body_fd = -1;
  uint64_t body_offset = 0;
  uint64_t body_size = 0;
  std::string to_file;  // GET: stream the body into this file instead of memory
  std::string range;    // GET: "first-last" bytes only
};

struct S3ObjectStore::Response {
  long status = 0;
  std::string body;
  std::string etag;
  std::string sent_md5;  // PUT: hex MD5 of the bytes sent
};

namespace {

// The body of a PUT: memory, or a range of an open file read as curl sends it. The MD5 of the
// bytes is computed on the way out (restarted when curl rewinds for a retry of the send).
struct ReadState {
  const char* data = nullptr;
  int fd = -1;
  uint64_t offset = 0;
  uint64_t size = 0;
  uint64_t pos = 0;
  EVP_MD_CTX* md5 = nullptr;
  bool failed = false;
};

size_t read_cb(char* buf, size_t size, size_t n, void* user) {
  auto* st = static_cast<ReadState*>(user);
  const uint64_t want = std::min<uint64_t>(size * n, st->size - st->pos);
  uint64_t got = 0;
  if (st->data != nullptr) {
    std::memcpy(buf, st->data + st->pos, want);
    got = want;
  } else {
    while (got < want) {
      const ssize_t k =
          ::pread(st->fd, buf + got, want - got, static_cast<off_t>(st->offset + st->pos + got));
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) {
        st->failed = true;
        return CURL_READFUNC_ABORT;
      }
      got += static_cast<uint64_t>(k);
    }
  }
  if (st->md5 != nullptr) EVP_DigestUpdate(st->md5, buf, got);
  st->pos += got;
  return got;
}

int seek_cb(void* user, curl_off_t offset, int origin) {
  auto* st = static_cast<ReadState*>(user);
  if (origin != SEEK_SET || offset != 0) return CURL_SEEKFUNC_CANTSEEK;
  st->pos = 0;
  if (st->md5 != nullptr) EVP_DigestInit_ex(st->md5, EVP_md5(), nullptr);
  return CURL_SEEKFUNC_OK;
}

struct WriteState {
  std::string* body = nullptr;
  FILE* file = nullptr;
  long* status = nullptr;
  CURL* h = nullptr;
};

size_t write_cb(char* buf, size_t size, size_t n, void* user) {
  auto* st = static_cast<WriteState*>(user);
  const size_t k = size * n;
  long code = 0;
  curl_easy_getinfo(st->h, CURLINFO_RESPONSE_CODE, &code);
  // An error's body (XML) always goes to memory, never into the file being downloaded.
  if (st->file != nullptr && code >= 200 && code < 300) return std::fwrite(buf, 1, k, st->file);
  st->body->append(buf, k);
  return k;
}

size_t header_cb(char* buf, size_t size, size_t n, void* user) {
  auto* r = static_cast<S3ObjectStore::Response*>(user);
  const std::string line(buf, size * n);
  const auto colon = line.find(':');
  if (colon != std::string::npos) {
    std::string name = line.substr(0, colon);
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    if (name == "etag") r->etag = strip_quotes(line.substr(colon + 1));
  }
  return size * n;
}

}  // namespace

S3ObjectStore::S3ObjectStore(S3Settings settings, std::string bucket, TransferOptions options)
    : settings_(std::move(settings)), bucket_(std::move(bucket)), options_(options) {
  curl_init_once();
  options_.part_size = std::max<uint64_t>(options_.part_size, uint64_t{5} << 20);
  options_.multipart_threshold = std::max(options_.multipart_threshold, options_.part_size);
  options_.parallel = std::max(1, options_.parallel);
}

S3ObjectStore::~S3ObjectStore() = default;

std::string S3ObjectStore::uri(const std::string& key) const {
  return "s3://" + bucket_ + "/" + key;
}

S3ObjectStore::Response S3ObjectStore::perform(const Request& rq) {
  const std::string url = settings_.endpoint + "/" + uri_encode(bucket_, false) +
                          (rq.key.empty() ? "" : "/" + uri_encode(rq.key, true)) +
                          (rq.query.empty() ? "" : "?" + rq.query);
  const std::string where = rq.key.empty() ? "s3://" + bucket_ : uri(rq.key);
  const std::string sigv4 = "aws:amz:" + settings_.region + ":s3";
  double wait = options_.backoff_s;
  for (int attempt = 0;; ++attempt) {
    Response r;
    CURL* h = t_handle.get();
    struct curl_slist* headers = nullptr;
    headers = curl_slist_append(headers, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    headers = curl_slist_append(headers, "Expect:");
    if (!settings_.session_token.empty())
      headers =
          curl_slist_append(headers, ("x-amz-security-token: " + settings_.session_token).c_str());
    ReadState rs;
    rs.data = rq.body;
    rs.fd = rq.body_fd;
    rs.offset = rq.body_offset;
    rs.size = rq.body_size;
    std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> md5(EVP_MD_CTX_new(), EVP_MD_CTX_free);
    // A file range is hashed beside the send, on another thread (put_part_or_object).
    if (rq.body_fd < 0) {
      rs.md5 = md5.get();
      EVP_DigestInit_ex(rs.md5, EVP_md5(), nullptr);
    }
    FILE* file = nullptr;
    if (!rq.to_file.empty()) {
      file = std::fopen(rq.to_file.c_str(), "wb");
      if (file == nullptr) {
        curl_slist_free_all(headers);
        MT_THROW(IoError, "cannot write ", rq.to_file, ": ", std::strerror(errno));
      }
    }
    WriteState ws{&r.body, file, &r.status, h};
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sigv4.c_str());
    curl_easy_setopt(h, CURLOPT_USERNAME, settings_.access_key.c_str());
    curl_easy_setopt(h, CURLOPT_PASSWORD, settings_.secret_key.c_str());
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options_.connect_timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, static_cast<long>(options_.stall_timeout_s));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, write_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &ws);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
    curl_easy_setopt(h, CURLOPT_UPLOAD_BUFFERSIZE, 2L * 1024 * 1024);
    if (rq.method == "PUT") {
      curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
      curl_easy_setopt(h, CURLOPT_READFUNCTION, read_cb);
      curl_easy_setopt(h, CURLOPT_READDATA, &rs);
      curl_easy_setopt(h, CURLOPT_SEEKFUNCTION, seek_cb);
      curl_easy_setopt(h, CURLOPT_SEEKDATA, &rs);
      curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(rq.body_size));
    } else if (rq.method == "POST") {
      curl_easy_setopt(h, CURLOPT_POST, 1L);
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, rq.body != nullptr ? rq.body : "");
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(rq.body_size));
    } else if (rq.method == "HEAD") {
      curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    } else if (!rq.range.empty()) {
      curl_easy_setopt(h, CURLOPT_RANGE, rq.range.c_str());
    } else if (rq.method == "DELETE") {
      curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, "DELETE");
    }
    const CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(headers);
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    if (file != nullptr && std::fclose(file) != 0 && rc == CURLE_OK)
      MT_THROW(IoError, "cannot write ", rq.to_file, ": ", std::strerror(errno));
    if (rq.method == "PUT" && rs.md5 != nullptr) {
      unsigned char digest[16];
      unsigned int len = 0;
      EVP_DigestFinal_ex(rs.md5, digest, &len);
      r.sent_md5 = to_hex(digest, 16);
    }
    std::string problem;
    bool transient = false;
    if (rs.failed) MT_THROW(IoError, "cannot read the body of ", where, ": ", std::strerror(errno));
    if (rc != CURLE_OK) {
      problem = detail::str_cat(curl_easy_strerror(rc), " (", settings_.endpoint, ")");
      transient = true;
    } else if (r.status == 401 || r.status == 403) {
      const std::string code = xml_tag(r.body, "Code").value_or("");
      const std::string msg = xml_tag(r.body, "Message").value_or("");
      MT_THROW(ObjectStoreAuthError, rq.method, " ", where, ": access denied (HTTP ", r.status,
               code.empty() ? "" : " " + code, msg.empty() ? "" : ": " + msg, ") with access key ",
               settings_.access_key.substr(0, 4), "... from ", settings_.credentials_from,
               "; check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE");
    } else if (r.status >= 500 || r.status == 408 || r.status == 429) {
      problem = detail::str_cat("HTTP ", r.status, " ", xml_tag(r.body, "Code").value_or(""));
      transient = true;
    } else {
      return r;  // 2xx, 404 and other client errors: the caller decides
    }
    if (attempt >= options_.retries)
      throw ObjectStoreError(
          detail::str_cat(rq.method, " ", where, ": ", problem, " (after ", attempt + 1, " tries)"),
          transient);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
    wait *= 2;
  }
}

namespace {

[[noreturn]] void fail_status(const std::string& method, const std::string& where,
                              const S3ObjectStore::Response& r) {
  const std::string code = xml_tag(r.body, "Code").value_or("");
  const std::string msg = xml_tag(r.body, "Message").value_or("");
  throw ObjectStoreError(
      detail::str_cat(method, " ", where, ": HTTP ", r.status, code.empty() ? "" : " " + code,
                      msg.empty() ? "" : ": " + msg),
      false);
}

}  // namespace

void S3ObjectStore::put_part_or_object(const std::string& key, const std::string& query,
                                       const char* data, int fd, uint64_t offset, uint64_t size,
                                       std::string* etag_out) {
  Request rq;
  rq.method = "PUT";
  rq.key = key;
  rq.query = query;
  rq.body = data;
  rq.body_fd = fd;
  rq.body_offset = offset;
  rq.body_size = size;
  // A file range (a committed checkpoint's file: it does not change) is hashed on a thread of
  // its own while curl sends it, so that the checksum costs no time on the sending thread.
  std::string file_md5;
  std::exception_ptr hash_error;
  std::thread hasher;
  if (data == nullptr) {
    hasher = std::thread([&] {
      try {
        file_md5 = md5_file_hex(fd, offset, size, "the body of " + uri(key));
      } catch (...) {
        hash_error = std::current_exception();
      }
    });
  }
  Response r;
  try {
    r = perform(rq);
  } catch (...) {
    if (hasher.joinable()) hasher.join();
    throw;
  }
  if (hasher.joinable()) hasher.join();
  if (hash_error) std::rethrow_exception(hash_error);
  if (data == nullptr) r.sent_md5 = file_md5;
  if (r.status < 200 || r.status >= 300) fail_status("PUT", uri(key), r);
  // The server's MD5 of what it stored against ours of what was sent.
  if (r.etag != r.sent_md5)
    throw ObjectStoreError(detail::str_cat("PUT ", uri(key), query.empty() ? "" : "?" + query,
                                           ": the server's checksum (ETag ", r.etag,
                                           ") is not the MD5 of the bytes sent (", r.sent_md5, ")"),
                           true);
  if (etag_out != nullptr) *etag_out = r.etag;
}

void S3ObjectStore::put_bytes(const std::string& key, const std::string& bytes) {
  put_part_or_object(key, "", bytes.data(), -1, 0, bytes.size(), nullptr);
}

namespace {

struct OpenFile {
  int fd;
  explicit OpenFile(const std::string& path) : fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd < 0) MT_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
  }
  ~OpenFile() { ::close(fd); }
};

}  // namespace

void S3ObjectStore::put_file(const std::string& key, const std::string& path) {
  const OpenFile f(path);
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) MT_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < options_.multipart_threshold) {
    put_part_or_object(key, "", nullptr, f.fd, 0, size, nullptr);
    return;
  }
  put_multipart(key, f.fd, size);
}

void S3ObjectStore::put_multipart(const std::string& key, int fd, uint64_t size) {
  Request start;
  start.method = "POST";
  start.key = key;
  start.query = "uploads=";
  const Response r = perform(start);
  if (r.status != 200) fail_status("POST", uri(key) + "?uploads", r);
  const std::string upload_id = xml_tag(r.body, "UploadId").value_or("");
  if (upload_id.empty())
    throw ObjectStoreError("POST " + uri(key) + "?uploads: the answer holds no UploadId", false);
  const std::string id_q = "uploadId=" + uri_encode(upload_id, false);
  const uint64_t part = options_.part_size;
  const int64_t parts = static_cast<int64_t>((size + part - 1) / part);
  std::vector<std::string> etags(static_cast<size_t>(parts));
  try {
    parallel_for(parts, options_.parallel, [&](int64_t i) {
      const uint64_t off = static_cast<uint64_t>(i) * part;
      put_part_or_object(key, detail::str_cat("partNumber=", i + 1, "&", id_q), nullptr, fd, off,
                         std::min(part, size - off), &etags[static_cast<size_t>(i)]);
    });
    std::string xml = "<CompleteMultipartUpload>";
    std::string md5s;
    for (int64_t i = 0; i < parts; ++i) {
      xml += detail::str_cat("<Part><PartNumber>", i + 1, "</PartNumber><ETag>\"",
                             etags[static_cast<size_t>(i)], "\"</ETag></Part>");
      for (size_t k = 0; k + 1 < etags[static_cast<size_t>(i)].size(); k += 2)
        md5s +=
            static_cast<char>(std::stoi(etags[static_cast<size_t>(i)].substr(k, 2), nullptr, 16));
    }
    xml += "</CompleteMultipartUpload>";
    Request done;
    done.method = "POST";
    done.key = key;
    done.query = id_q;
    done.body = xml.data();
    done.body_size = xml.size();
    const Response c = perform(done);
    // S3 may answer 200 and put the error in the body.
    if (c.status != 200 || c.body.find("<Error>") != std::string::npos)
      fail_status("POST", uri(key) + "?uploadId", c);
    const std::string want = md5_hex(md5s.data(), md5s.size()) + "-" + std::to_string(parts);
    std::string got = xml_tag(c.body, "ETag").value_or("");
    got = strip_quotes(got);
    // S3 answers the MD5 of the parts' MD5s with "-<parts>"; some servers (s3rver) the MD5 of
    // the whole object. Each part was checked by its own MD5 already; the assembled object is
    // then checked by its size.
    if (got.find('-') != std::string::npos ? got != want : false)
      throw ObjectStoreError(
          detail::str_cat("PUT ", uri(key), ": the server's multipart checksum (", got,
                          ") is not that of the parts sent (", want, ")"),
          true);
    if (got.find('-') == std::string::npos) {
      const auto info = head(key);
      if (!info || info->size != size)
        throw ObjectStoreError(detail::str_cat("PUT ", uri(key), ": the assembled object has ",
                                               info ? info->size : 0, " bytes, not ", size),
                               true);
    }
  } catch (...) {
    try {
      Request abort;
      abort.method = "DELETE";
      abort.key = key;
      abort.query = id_q;
      perform(abort);
    } catch (...) {
    }
    throw;
  }
}

std::optional<std::string> S3ObjectStore::get_bytes(const std::string& key) {
  Request rq;
  rq.key = key;
  Response r = perform(rq);
  if (r.status == 404) return std::nullopt;
  if (r.status != 200) fail_status("GET", uri(key), r);
  return std::move(r.body);
}

std::optional<std::string> S3ObjectStore::get_range(const std::string& key, uint64_t offset,
                                                    uint64_t size) {
  MT_CHECK(size > 0, "empty range of ", uri(key));
  Request rq;
  rq.key = key;
  rq.range = detail::str_cat(offset, "-", offset + size - 1);
  Response r = perform(rq);
  if (r.status == 404) return std::nullopt;
  // 200: a server that ignores ranges sends the whole object.
  if (r.status == 200 && r.body.size() > offset) return r.body.substr(offset, size);
  if (r.status != 206) fail_status("GET", uri(key) + " (bytes " + rq.range + ")", r);
  return std::move(r.body);
}

bool S3ObjectStore::get_file(const std::string& key, const std::string& path) {
  Request rq;
  rq.key = key;
  rq.to_file = path + ".part";
  const Response r = perform(rq);
  std::error_code ec;
  if (r.status == 404) {
    fs::remove(rq.to_file, ec);
    return false;
  }
  if (r.status != 200) {
    fs::remove(rq.to_file, ec);
    fail_status("GET", uri(key), r);
  }
  fs::rename(rq.to_file, path, ec);
  if (ec) MT_THROW(IoError, "cannot rename ", rq.to_file, ": ", ec.message());
  return true;
}

std::optional<ObjectInfo> S3ObjectStore::head(const std::string& key) {
  Request rq;
  rq.method = "HEAD";
  rq.key = key;
  const Response r = perform(rq);
  if (r.status == 404) return std::nullopt;
  if (r.status != 200) fail_status("HEAD", uri(key), r);
  ObjectInfo info;
  info.key = key;
  info.etag = r.etag;
  curl_off_t len = 0;
  // The handle of this thread still holds the answer's length.
  curl_easy_getinfo(t_handle.h, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &len);
  info.size = len > 0 ? static_cast<uint64_t>(len) : 0;
  return info;
}

std::vector<ObjectInfo> S3ObjectStore::list(const std::string& prefix) {
  std::vector<ObjectInfo> out;
  std::string token;
  for (;;) {
    Request rq;
    rq.query = (token.empty() ? "" : "continuation-token=" + uri_encode(token, false) + "&") +
               "list-type=2&prefix=" + uri_encode(prefix, false);
    const Response r = perform(rq);
    if (r.status != 200) fail_status("GET", "s3://" + bucket_ + "/" + prefix + " (list)", r);
    size_t pos = 0;
    while (auto item = xml_tag(r.body, "Contents", &pos)) {
      ObjectInfo info;
      info.key = xml_tag(*item, "Key").value_or("");
      info.size = std::stoull(xml_tag(*item, "Size").value_or("0"));
      info.etag = strip_quotes(xml_tag(*item, "ETag").value_or(""));
      const std::string modified = xml_tag(*item, "LastModified").value_or("");
      std::tm tm{};
      if (strptime(modified.c_str(), "%Y-%m-%dT%H:%M:%S", &tm) != nullptr)
        info.modified_unix_s = static_cast<double>(timegm(&tm));
      out.push_back(std::move(info));
    }
    if (xml_tag(r.body, "IsTruncated").value_or("false") != "true") break;
    token = xml_tag(r.body, "NextContinuationToken").value_or("");
    if (token.empty()) break;
  }
  std::sort(out.begin(), out.end(),
            [](const ObjectInfo& a, const ObjectInfo& b) { return a.key < b.key; });
  return out;
}

void S3ObjectStore::remove(const std::string& key) {
  Request rq;
  rq.method = "DELETE";
  rq.key = key;
  const Response r = perform(rq);
  if (r.status != 204 && r.status != 200 && r.status != 404) fail_status("DELETE", uri(key), r);
}

std::unique_ptr<ObjectStore> open_object_store(const ObjectUri& uri, TransferOptions options) {
  return std::make_unique<S3ObjectStore>(S3Settings::from_environment(), uri.bucket, options);
}

}  // namespace meshtrain::ckpt
