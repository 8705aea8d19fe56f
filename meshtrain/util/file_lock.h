// An exclusive flock on a lock file, held for the object's lifetime: how the processes of one
// host take turns over a shared local directory (a download cache, a checkpoint root being
// filled from object storage). Advisory, and only as reliable as flock on that filesystem: keep
// such directories host-local.
#pragma once

#include <string>

namespace meshtrain {

class FileLock {
 public:
  // Creates `path` if needed and waits for the lock. IoError naming the file, with `hint` (what
  // to do) appended, when it cannot be opened or locked.
  explicit FileLock(const std::string& path, const std::string& hint = "");
  ~FileLock();
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace meshtrain
