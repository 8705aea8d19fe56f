// Writes a file so that readers see either the old contents or the complete new ones, never a
// torn write: data goes to "<path>.tmp", is fsynced, renamed over <path>, and the directory is
// fsynced so the rename itself survives a crash. A writer dropped without commit() removes its
// temporary file.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace meshtrain {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);  // throws IoError naming the file
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t nbytes);
  void write(std::string_view bytes) { write(bytes.data(), bytes.size()); }
  size_t bytes_written() const { return written_; }
  void commit();  // fsync, rename, fsync the directory

 private:
  std::string path_;
  std::string tmp_path_;
  int fd_ = -1;
  size_t written_ = 0;
};

void write_file_atomic(const std::string& path, std::string_view bytes);

}  // namespace meshtrain
