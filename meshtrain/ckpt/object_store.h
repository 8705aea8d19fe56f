// Object storage for checkpoints: `s3://bucket/prefix` URIs, an ObjectStore interface (put a
// file, multipart for large ones with parts in parallel; get; head; list; delete) and its
// implementation on libcurl against any S3-compatible server, signed with libcurl's own AWS
// Signature V4 (CURLOPT_AWS_SIGV4), path-style addressing (ENDPOINT/bucket/key).
//
// Where the server is and who we are comes from the usual AWS settings (S3Settings::
// from_environment): AWS_ENDPOINT_URL (default https://s3.REGION.amazonaws.com), AWS_REGION or
// AWS_DEFAULT_REGION (default us-east-1), AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_SESSION_TOKEN, else the profile AWS_PROFILE (default "default") of the credentials file
// (AWS_SHARED_CREDENTIALS_FILE, default ~/.aws/credentials). No message, log line or exception
// ever holds the secret key or the session token.
//
// Every object's bytes are checked: the MD5 of each PUT's body is computed as the bytes go out
// (streamed from the file: no copy in memory, no second pass), and the ETag the server answers
// (its MD5 of what it stored) must be that MD5 (for a multipart object: each part's, and the
// whole object's size), else the upload fails naming the object and is tried again. Each request is
// retried with exponential backoff on a connection failure, a timeout, 5xx, 408 and 429; a refusal
// (403: wrong key, signature, no access) is thrown at once as ObjectStoreAuthError.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/util/error.h"

namespace meshtrain::ckpt {

// A request the server refused or could not be reached for, after retries; the message names
// the object (s3://bucket/key) and the status or the connection error.
class ObjectStoreError : public IoError {
 public:
  ObjectStoreError(const std::string& what, bool transient)
      : IoError(what), transient_(transient) {}
  // A connection failure, timeout or 5xx: trying later may work.
  bool transient() const { return transient_; }

 private:
  bool transient_;
};

// 401/403: the credentials or their permissions are wrong; retrying does not help.
class ObjectStoreAuthError : public ObjectStoreError {
 public:
  explicit ObjectStoreAuthError(const std::string& what) : ObjectStoreError(what, false) {}
};

// s3://bucket/prefix, the prefix without leading or trailing slashes (may be empty).
struct ObjectUri {
  std::string bucket;
  std::string prefix;
  // "s3://bucket/prefix"
  std::string str() const;
  // prefix + "/" + rel (just rel when the prefix is empty).
  std::string key(const std::string& rel) const;
};

bool is_object_uri(const std::string& path);  // starts with "s3://"

// The host-local directory objects are downloaded into (checkpoints fetched for `meshtrain ckpt`,
// datasets): MESHTRAIN_S3_CACHE, else $XDG_CACHE_HOME/meshtrain/s3, else ~/.cache/meshtrain/s3.
std::string object_cache_root();
// ValueError, one line, for anything else or an empty bucket.
ObjectUri parse_object_uri(const std::string& uri);

struct S3Settings {
  std::string endpoint;  // scheme://host[:port], no trailing slash
  std::string region = "us-east-1";
  std::string access_key;
  std::string secret_key;        // never printed
  std::string session_token;     // never printed
  std::string credentials_from;  // where the key came from (for messages): "environment", a file
  // From the AWS_* variables and the credentials file (see the top of this file). ValueError,
  // one line, when no access key is found.
  static S3Settings from_environment();
};

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;            // without quotes
  double modified_unix_s = 0;  // LastModified (listings only)
};

struct TransferOptions {
  uint64_t part_size = uint64_t{64} << 20;             // multipart part size (>= 5 MiB)
  uint64_t multipart_threshold = uint64_t{512} << 20;  // files this large go multipart
  int parallel = 4;                                    // parts (or small files) at a time
  int retries = 4;                                     // retries of a request after the first try
  double backoff_s = 0.2;                              // first retry's wait, doubling each time
  double connect_timeout_s = 5;
  // A request stalled below 1 KiB/s for this long fails (and is retried).
  double stall_timeout_s = 30;
};

class ObjectStore {
 public:
  virtual ~ObjectStore() = default;
  // The URI of a key, for messages: s3://bucket/key.
  virtual std::string uri(const std::string& key) const = 0;
  // Uploads a local file (multipart when large, parts in parallel); checked by MD5.
  virtual void put_file(const std::string& key, const std::string& path) = 0;
  virtual void put_bytes(const std::string& key, const std::string& bytes) = 0;
  // The object's bytes; nothing when it does not exist.
  virtual std::optional<std::string> get_bytes(const std::string& key) = 0;
  // Downloads into `path` (written to path + ".part", then renamed); false when it does not
  // exist.
  virtual bool get_file(const std::string& key, const std::string& path) = 0;
  // Bytes [offset, offset + size) of the object (fewer at its end); nothing when it does not
  // exist.
  virtual std::optional<std::string> get_range(const std::string& key, uint64_t offset,
                                               uint64_t size) = 0;
  virtual std::optional<ObjectInfo> head(const std::string& key) = 0;
  // Every object whose key starts with `prefix`, in key order.
  virtual std::vector<ObjectInfo> list(const std::string& prefix) = 0;
  // Deleting a missing object is no error.
  virtual void remove(const std::string& key) = 0;
};

// Runs fn(0..n-1) on up to `threads` threads; the first exception is rethrown once all stopped.
void parallel_for(int64_t n, int threads, const std::function<void(int64_t)>& fn);

class S3ObjectStore : public ObjectStore {
 public:
  S3ObjectStore(S3Settings settings, std::string bucket, TransferOptions options = {});
  ~S3ObjectStore() override;

  std::string uri(const std::string& key) const override;
  void put_file(const std::string& key, const std::string& path) override;
  void put_bytes(const std::string& key, const std::string& bytes) override;
  std::optional<std::string> get_bytes(const std::string& key) override;
  bool get_file(const std::string& key, const std::string& path) override;
  std::optional<std::string> get_range(const std::string& key, uint64_t offset,
                                       uint64_t size) override;
  std::optional<ObjectInfo> head(const std::string& key) override;
  std::vector<ObjectInfo> list(const std::string& prefix) override;
  void remove(const std::string& key) override;

  const TransferOptions& options() const { return options_; }

  struct Response;
  struct Request;

 private:
  Response perform(const Request& request);  // with retries
  // The body: `data` when not null, else `size` bytes of `fd` from `offset`.
  void put_part_or_object(const std::string& key, const std::string& query, const char* data,
                          int fd, uint64_t offset, uint64_t size, std::string* etag_out);
  void put_multipart(const std::string& key, int fd, uint64_t size);

  S3Settings settings_;
  std::string bucket_;
  TransferOptions options_;
};

// An S3ObjectStore for the bucket of `uri`, configured from the environment.
std::unique_ptr<ObjectStore> open_object_store(const ObjectUri& uri, TransferOptions options = {});

// Hex MD5 (lowercase) and its base64 form, for Content-MD5 and ETag checks.
std::string md5_hex(const char* data, uint64_t size);
std::string md5_base64(const char* data, uint64_t size);
// Hex MD5 of `size` bytes of the open file `fd` from `offset`, read in blocks; IoError naming
// `what` when the file ends early.
std::string md5_file_hex(int fd, uint64_t offset, uint64_t size, const std::string& what);
// Hex MD5 of a whole file.
std::string md5_file_hex(const std::string& path);

}  // namespace meshtrain::ckpt
