// A Store in a file that several processes on one host (or a shared file system with working
// flock) open by path. The file is an append-only log of set/remove records; each process
// replays the records it has not seen yet under flock, so every operation is atomic across
// processes. Blocking get/wait poll the file with a short back-off: meant for tests and
// single-host jobs, not for thousands of ranks.
#pragma once

#include <map>
#include <mutex>

#include "meshtrain/comm/store.h"

namespace meshtrain::comm {

class FileStore : public Store {
 public:
  explicit FileStore(std::string path);
  ~FileStore() override;
  FileStore(const FileStore&) = delete;
  FileStore& operator=(const FileStore&) = delete;

  void set(const std::string& key, const Bytes& value) override;
  Bytes get(const std::string& key) override;
  int64_t add(const std::string& key, int64_t delta) override;
  Bytes compare_set(const std::string& key, const Bytes& expected, const Bytes& desired) override;
  void wait(const std::vector<std::string>& keys, Duration timeout) override;
  using Store::wait;
  bool remove(const std::string& key) override;
  bool check(const std::vector<std::string>& keys) override;

  const std::string& path() const { return path_; }

  // Records larger than this are refused on write and treated as corruption on read.
  static constexpr uint32_t kMaxValueBytes = 64u << 20;

 private:
  class Lock;
  void refresh();  // replays new records; call with the file locked
  void append(uint8_t kind, const std::string& key, const Bytes& value);
  bool has_all(const std::vector<std::string>& keys) const;

  std::string path_;
  int fd_ = -1;
  std::mutex mu_;  // serialises this object's threads; flock serialises processes
  uint64_t offset_ = 0;
  std::map<std::string, Bytes> data_;
};

}  // namespace meshtrain::comm
