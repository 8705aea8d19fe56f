// Runs a test's body in a child process whose /dev/shm is a small tmpfs of its own (a private
// mount namespace, root only, as CI runs), as in a container with the default 64 MiB: the shm
// backend's sizing, budget and error paths are tested against a real full /dev/shm.
#pragma once

#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <optional>
#include <string>

#include "tests/support/child_process.h"

namespace meshtrain::testing {

// Runs `body` in a child with a /dev/shm of `size` (tmpfs syntax: "64m") and returns the child's
// exit code: body's result, 3 when the namespace could not be made (the reason is printed; skip
// with MT_SKIP_UNLESS("mountns", rc != 3, ...)) or 7 for an exception (printed). A SIGBUS, or
// any other death by a signal, fails the test.
inline int with_small_dev_shm(const char* size, const std::function<int()>& body) {
  ChildProcess child = fork_child([&] {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 ||
        ::mount("tmpfs", "/dev/shm", "tmpfs", 0, (std::string("size=") + size).c_str()) != 0) {
      std::fprintf(stderr, "mount namespace with a small /dev/shm: %s\n", std::strerror(errno));
      return 3;
    }
    int rc = 0;
    try {
      rc = body();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s\n", e.what());
      rc = 7;
    }
    return rc;
  });
  if (!child.started()) return 3;
  const std::optional<int> status = child.wait_for(std::chrono::seconds(120));
  EXPECT_TRUE(status.has_value()) << "the child still ran after 120 s (killed)";
  if (!status) return -1;
  EXPECT_TRUE(WIFEXITED(*status)) << "the child died of signal " << WTERMSIG(*status);
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : -1;
}

}  // namespace meshtrain::testing
