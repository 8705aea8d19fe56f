// See file_store.h. Record layout: kind u8 (1 set, 2 remove) | key length u32 | key |
// value length u32 | value, little-endian. Every length is checked against the file's size
// and the store's limits before it is used.
#include "meshtrain/comm/file_store.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/store_protocol.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

constexpr uint8_t kRecordSet = 1;
constexpr uint8_t kRecordRemove = 2;

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}

}  // namespace

// Holds the file's flock for one operation.
class FileStore::Lock {
 public:
  Lock(int fd, const std::string& path) : fd_(fd) {
    while (::flock(fd_, LOCK_EX) < 0) {
      if (errno != EINTR) MT_THROW(IoError, "cannot lock store file ", path, ": ", strerror(errno));
    }
  }
  ~Lock() { ::flock(fd_, LOCK_UN); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;

 private:
  int fd_;
};

FileStore::FileStore(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) MT_THROW(IoError, "cannot open store file ", path_, ": ", strerror(errno));
}

FileStore::~FileStore() {
  if (fd_ >= 0) ::close(fd_);
}

void FileStore::refresh() {
  struct stat st {};
  if (::fstat(fd_, &st) < 0) MT_THROW(IoError, "cannot stat store file ", path_);
  auto size = static_cast<uint64_t>(st.st_size);
  if (size < offset_) {  // The file was replaced or truncated: start over.
    data_.clear();
    offset_ = 0;
  }
  if (size == offset_) return;
  std::vector<uint8_t> buf(size - offset_);
  size_t got = 0;
  while (got < buf.size()) {
    ssize_t n = ::pread(fd_, buf.data() + got, buf.size() - got, static_cast<off_t>(offset_ + got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) MT_THROW(IoError, "cannot read store file ", path_);
    got += static_cast<size_t>(n);
  }
  size_t pos = 0;
  auto corrupt = [&](const char* why) {
    MT_THROW(IoError, "store file ", path_, " is corrupt at offset ", offset_ + pos, ": ", why);
  };
  while (pos < buf.size()) {
    size_t left = buf.size() - pos;
    if (left < 9) corrupt("truncated record header");
    uint8_t kind = buf[pos];
    if (kind != kRecordSet && kind != kRecordRemove) corrupt("unknown record kind");
    uint32_t key_len = load_u32(&buf[pos + 1]);
    if (key_len > kMaxStoreKeyBytes || key_len > left - 9) corrupt("bad key length");
    std::string key(reinterpret_cast<const char*>(&buf[pos + 5]), key_len);
    uint32_t value_len = load_u32(&buf[pos + 5 + key_len]);
    if (value_len > kMaxValueBytes || value_len > left - 9 - key_len) corrupt("bad value length");
    const uint8_t* value = &buf[pos + 9 + key_len];
    if (kind == kRecordSet) {
      data_[key] = Bytes(value, value + value_len);
    } else {
      data_.erase(key);
    }
    pos += 9 + key_len + value_len;
  }
  offset_ = size;
}

void FileStore::append(uint8_t kind, const std::string& key, const Bytes& value) {
  if (key.size() > kMaxStoreKeyBytes) MT_THROW(StoreError, "store key too long: ", key.size());
  if (value.size() > kMaxValueBytes) MT_THROW(StoreError, "store value too large: ", value.size());
  WireWriter w;
  w.u8(kind);
  w.str(key);
  w.bytes(value);
  Bytes rec = w.take();
  // Writes at the current end under the lock; a single pwrite keeps the record contiguous.
  size_t done = 0;
  while (done < rec.size()) {
    ssize_t n =
        ::pwrite(fd_, rec.data() + done, rec.size() - done, static_cast<off_t>(offset_ + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) MT_THROW(IoError, "cannot write store file ", path_, ": ", strerror(errno));
    done += static_cast<size_t>(n);
  }
  offset_ += rec.size();
  if (kind == kRecordSet) {
    data_[key] = value;
  } else {
    data_.erase(key);
  }
}

void FileStore::set(const std::string& key, const Bytes& value) {
  std::lock_guard guard(mu_);
  Lock lock(fd_, path_);
  refresh();
  append(kRecordSet, key, value);
}

bool FileStore::has_all(const std::vector<std::string>& keys) const {
  return std::all_of(keys.begin(), keys.end(), [&](const auto& k) { return data_.count(k) > 0; });
}

Bytes FileStore::get(const std::string& key) {
  wait({key}, timeout_);
  std::lock_guard guard(mu_);
  Lock lock(fd_, path_);
  refresh();
  auto it = data_.find(key);
  if (it == data_.end()) throw TimeoutError(missing_keys_message({key}, timeout_));
  return it->second;
}

int64_t FileStore::add(const std::string& key, int64_t delta) {
  std::lock_guard guard(mu_);
  Lock lock(fd_, path_);
  refresh();
  auto it = data_.find(key);
  int64_t v = (it == data_.end() ? 0 : parse_store_integer(key, it->second)) + delta;
  append(kRecordSet, key, format_store_integer(v));
  return v;
}

Bytes FileStore::compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) {
  std::lock_guard guard(mu_);
  Lock lock(fd_, path_);
  refresh();
  auto it = data_.find(key);
  if (it == data_.end() ? expected.empty() : it->second == expected) {
    append(kRecordSet, key, desired);
    return desired;
  }
  return it == data_.end() ? Bytes() : it->second;
}

void FileStore::wait(const std::vector<std::string>& keys, Duration timeout) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  auto nap = std::chrono::milliseconds(1);
  while (true) {
    {
      std::lock_guard guard(mu_);
      Lock lock(fd_, path_);
      refresh();
      if (has_all(keys)) return;
      if (std::chrono::steady_clock::now() >= deadline) {
        std::vector<std::string> missing;
        for (const auto& k : keys) {
          if (!data_.count(k)) missing.push_back(k);
        }
        throw TimeoutError(missing_keys_message(missing, timeout));
      }
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    std::this_thread::sleep_for(std::max(std::chrono::milliseconds(0), std::min(nap, left)));
    nap = std::min(nap * 2, std::chrono::milliseconds(50));
  }
}

bool FileStore::remove(const std::string& key) {
  std::lock_guard guard(mu_);
  Lock lock(fd_, path_);
  refresh();
  if (!data_.count(key)) return false;
  append(kRecordRemove, key, {});
  return true;
}

bool FileStore::check(const std::vector<std::string>& keys) {
  std::lock_guard guard(mu_);
  Lock lock(fd_, path_);
  refresh();
  return has_all(keys);
}

}  // namespace meshtrain::comm
