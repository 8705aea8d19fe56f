// FileLock: while one process holds it, another cannot take the same lock file; once released,
// it can; a lock file that cannot be opened is an IoError naming it, with the caller's hint.
#include "meshtrain/util/file_lock.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <optional>
#include <string>

#include "meshtrain/util/error.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshtrain {
namespace {

// 0 when a separate process could take the lock at once, 1 when it was held.
int try_lock_elsewhere(const std::string& path) {
  testing::ChildProcess child = testing::fork_child([&] {
    const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return 2;
    return ::flock(fd, LOCK_EX | LOCK_NB) == 0 ? 0 : 1;
  });
  const std::optional<int> status = child.wait_for(std::chrono::seconds(30));
  if (!status || !WIFEXITED(*status)) return -1;
  return WEXITSTATUS(*status);
}

TEST(FileLock, ExcludesOtherProcessesUntilReleased) {
  testing::TempDir dir;
  const std::string path = dir.file("cache.lock");
  {
    const FileLock lock(path);
    EXPECT_EQ(try_lock_elsewhere(path), 1);
  }
  EXPECT_EQ(try_lock_elsewhere(path), 0);
}

TEST(FileLock, AnUnopenableFileNamesItAndTheHint) {
  testing::TempDir dir;
  const std::string path = dir.file("missing/dir/x.lock");
  try {
    const FileLock lock(path, " (set X to a writable directory)");
    ADD_FAILURE() << "locked " << path;
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path), std::string::npos) << what;
    EXPECT_NE(what.find("(set X to a writable directory)"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace meshtrain
