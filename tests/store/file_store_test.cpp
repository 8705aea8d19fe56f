// FileStore across real processes: the point of a file store is that separate processes share
// it, so the atomicity of add and the visibility of set are checked with fork().
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <optional>

#include "meshtrain/comm/file_store.h"
#include "meshtrain/util/error.h"
#include "tests/support/child_process.h"

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;

std::string temp_path(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() /
           ("meshtrain_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove(p);
  return p.string();
}

TEST(FileStoreTest, AddsFromForkedProcessesAreAtomic) {
  const std::string path = temp_path("filestore_fork");
  constexpr int kProcs = 4;
  constexpr int kAdds = 100;
  std::vector<meshtrain::testing::ChildProcess> children;  // killed and reaped with the test
  for (int p = 0; p < kProcs; ++p) {
    children.push_back(meshtrain::testing::fork_child([&] {
      int status = 0;
      try {
        FileStore s(path);
        s.set_timeout(20s);
        s.set_string("ready/" + std::to_string(p), "1");
        s.get("go");  // a barrier: the parent sets it once every child is ready
        for (int i = 0; i < kAdds; ++i) s.add("counter", 1);
      } catch (...) {
        status = 1;
      }
      return status;
    }));
    ASSERT_TRUE(children.back().started());
  }
  FileStore parent(path);
  std::vector<std::string> ready;
  for (int p = 0; p < kProcs; ++p) ready.push_back("ready/" + std::to_string(p));
  parent.wait(ready, 20s);
  parent.set_string("go", "1");
  for (auto& child : children) {
    const std::optional<int> status = child.wait_for(60s);
    ASSERT_TRUE(status.has_value()) << "a child still adds after 60 s";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  }
  EXPECT_EQ(parent.add("counter", 0), kProcs * kAdds);
  std::filesystem::remove(path);
}

TEST(FileStoreTest, CorruptFileIsReportedNotTrusted) {
  const std::string path = temp_path("filestore_corrupt");
  {
    std::ofstream out(path, std::ios::binary);
    // A set record claiming a 4 GiB key.
    const char rec[] = {1, '\xff', '\xff', '\xff', '\xff', 0, 0, 0, 0};
    out.write(rec, sizeof(rec));
  }
  FileStore s(path);
  EXPECT_THROW(s.check({"k"}), IoError);
  std::filesystem::remove(path);
}

TEST(FileStoreTest, RemoveIsVisibleToOtherInstances) {
  const std::string path = temp_path("filestore_remove");
  FileStore a(path);
  FileStore b(path);
  a.set_string("k", "v");
  EXPECT_EQ(b.get_string("k"), "v");
  EXPECT_TRUE(b.remove("k"));
  EXPECT_FALSE(a.check({"k"}));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace meshtrain::comm
