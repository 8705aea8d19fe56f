// POSIX implementation of the write-to-temporary-then-rename protocol.
#include "meshtrain/util/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "meshtrain/util/error.h"

namespace meshtrain {

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), tmp_path_(path_ + ".tmp") {
  fd_ = ::open(tmp_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) MT_THROW(IoError, "cannot create ", tmp_path_, ": ", std::strerror(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_path_.c_str());
  }
}

void AtomicFileWriter::write(const void* data, size_t nbytes) {
  MT_CHECK(fd_ >= 0, "write after commit to ", path_);
  const char* p = static_cast<const char*>(data);
  while (nbytes > 0) {
    ssize_t n = ::write(fd_, p, nbytes);
    if (n < 0) {
      if (errno == EINTR) continue;
      MT_THROW(IoError, "cannot write ", tmp_path_, ": ", std::strerror(errno));
    }
    p += n;
    nbytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
}

void AtomicFileWriter::commit() {
  MT_CHECK(fd_ >= 0, "commit twice to ", path_);
  if (::fsync(fd_) != 0) MT_THROW(IoError, "cannot fsync ", tmp_path_, ": ", std::strerror(errno));
  int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    MT_THROW(IoError, "cannot close ", tmp_path_, ": ", std::strerror(err));
  }
  if (std::rename(tmp_path_.c_str(), path_.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp_path_.c_str());
    MT_THROW(IoError, "cannot rename ", tmp_path_, " to ", path_, ": ", std::strerror(err));
  }
  std::filesystem::path dir = std::filesystem::path(path_).parent_path();
  if (dir.empty()) dir = ".";
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    // Best effort: some filesystems refuse fsync on directories; the data itself is synced.
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::string_view bytes) {
  AtomicFileWriter w(path);
  w.write(bytes);
  w.commit();
}

}  // namespace meshtrain
