#include "meshtrain/util/file_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain {

FileLock::FileLock(const std::string& path, const std::string& hint) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    MT_THROW(IoError, "cannot open the lock file ", path, ": ", std::strerror(errno), hint);
  while (::flock(fd_, LOCK_EX) < 0) {
    if (errno == EINTR) continue;
    const int err = errno;
    ::close(fd_);
    MT_THROW(IoError, "cannot lock ", path, ": ", std::strerror(err), hint);
  }
}

FileLock::~FileLock() {
  ::close(fd_);  // releases the lock
}

}  // namespace meshtrain
