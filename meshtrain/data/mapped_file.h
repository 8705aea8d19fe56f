// A read-only memory map of a whole file, released when the object goes. Token shards are read
// through it so that a multi-gigabyte dataset costs page cache, not process memory, and every
// rank on a host shares the same pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace meshtrain::data {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws IoError naming the file
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace meshtrain::data
