// One typed suite run against every Store implementation: they must agree on semantics, so
// code written against Store works with whichever one a deployment picks.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <memory>
#include <set>
#include <thread>

#include "meshtrain/comm/etcd_store.h"
#include "meshtrain/comm/file_store.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/prefix_store.h"
#include "meshtrain/comm/tcp_store.h"
#include "meshtrain/comm/tcp_store_server.h"
#include "meshtrain/util/error.h"
#include "tests/store/etcd_cluster.h"

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;

Bytes b(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

// Each factory hands out independent handles onto one shared store.
struct HashFactory {
  std::shared_ptr<HashStore> store = std::make_shared<HashStore>();
  std::shared_ptr<Store> make() { return store; }
};

struct FileFactory {
  std::string path;
  FileFactory() {
    static std::atomic<int> counter{0};
    path =
        (std::filesystem::temp_directory_path() /
         ("meshtrain_store_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++)))
            .string();
    std::filesystem::remove(path);
  }
  ~FileFactory() { std::filesystem::remove(path); }
  std::shared_ptr<Store> make() { return std::make_shared<FileStore>(path); }
};

struct PrefixFactory {
  std::shared_ptr<HashStore> base = std::make_shared<HashStore>();
  std::shared_ptr<Store> make() { return std::make_shared<PrefixStore>("job7", base); }
};

struct TcpFactory {
  AuthToken token{generate_token()};
  std::unique_ptr<TcpStoreServer> server;
  TcpFactory() {
    TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    o.token = token;
    server = std::make_unique<TcpStoreServer>(o);
  }
  std::shared_ptr<Store> make() {
    TcpStoreOptions o;
    o.token = token;
    o.timeout = 30s;
    return std::make_shared<TcpStore>("127.0.0.1", server->port(), o);
  }
};

// One single-member etcd for the whole program (started on first use); each factory takes a
// prefix of its own, so the tests never see each other's keys.
struct EtcdFactory {
  static testing::EtcdCluster& cluster() {
    static testing::EtcdCluster c(1);
    return c;
  }
  std::string prefix;
  EtcdFactory() {
    static std::atomic<int> counter{0};
    prefix = etcd_job_prefix("store-test-" + std::to_string(counter++));
  }
  std::shared_ptr<Store> make() {
    EtcdStoreOptions o;
    o.endpoints = cluster().endpoints();
    o.prefix = prefix;
    o.timeout = 30s;
    return std::make_shared<EtcdStore>(o);
  }
};

template <typename Factory>
class StoreTest : public ::testing::Test {
 protected:
  Factory factory;
};

using Factories =
    ::testing::Types<HashFactory, FileFactory, PrefixFactory, TcpFactory, EtcdFactory>;
TYPED_TEST_SUITE(StoreTest, Factories);

TYPED_TEST(StoreTest, SetThenGetFromAnotherHandle) {
  auto a = this->factory.make();
  auto c = this->factory.make();
  a->set("k", b("v1"));
  EXPECT_EQ(c->get("k"), b("v1"));
  c->set("k", b("second"));
  EXPECT_EQ(a->get("k"), b("second"));
  a->set("empty", {});
  EXPECT_TRUE(c->get("empty").empty());
}

TYPED_TEST(StoreTest, GetOfMissingKeyTimesOut) {
  auto s = this->factory.make();
  s->set_timeout(100ms);
  EXPECT_THROW(s->get("never-set"), TimeoutError);
}

TYPED_TEST(StoreTest, GetBlocksUntilAnotherHandleSets) {
  auto a = this->factory.make();
  auto c = this->factory.make();
  a->set_timeout(20s);
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    c->set("late", b("here"));
  });
  EXPECT_EQ(a->get("late"), b("here"));
  setter.join();
}

TYPED_TEST(StoreTest, AddCountsFromZeroAndStoresDecimal) {
  auto s = this->factory.make();
  EXPECT_EQ(s->add("c", 5), 5);
  EXPECT_EQ(s->add("c", -7), -2);
  EXPECT_EQ(s->get_string("c"), "-2");
  s->set("text", b("abc"));
  EXPECT_THROW(s->add("text", 1), StoreError);
}

TYPED_TEST(StoreTest, ConcurrentAddsFromEightThreadsGiveExactTotal) {
  constexpr int kThreads = 8;
  constexpr int kAdds = 150;
  std::vector<std::shared_ptr<Store>> handles;
  for (int t = 0; t < kThreads; ++t) handles.push_back(this->factory.make());
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kAdds; ++i) seen[t].push_back(handles[t]->add("counter", 1));
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(handles[0]->add("counter", 0), kThreads * kAdds);
  // Every add observed a distinct intermediate total: none was lost or applied twice.
  std::set<int64_t> all;
  for (const auto& v : seen) all.insert(v.begin(), v.end());
  EXPECT_EQ(all.size(), size_t(kThreads * kAdds));
}

TYPED_TEST(StoreTest, CompareSet) {
  auto s = this->factory.make();
  // Absent key with a non-empty expectation: nothing is stored.
  EXPECT_TRUE(s->compare_set("cs", b("x"), b("y")).empty());
  EXPECT_FALSE(s->check({"cs"}));
  // Absent key with an empty expectation: created.
  EXPECT_EQ(s->compare_set("cs", {}, b("first")), b("first"));
  // Wrong expectation: unchanged, returns the current value.
  EXPECT_EQ(s->compare_set("cs", b("other"), b("second")), b("first"));
  EXPECT_EQ(s->get("cs"), b("first"));
  // Right expectation: swapped.
  EXPECT_EQ(s->compare_set("cs", b("first"), b("second")), b("second"));
  EXPECT_EQ(s->get("cs"), b("second"));
}

TYPED_TEST(StoreTest, WaitTimesOutNamingMissingKeys) {
  auto s = this->factory.make();
  s->set("present", b("1"));
  try {
    s->wait({"present", "absent-key"}, 100ms);
    FAIL() << "wait returned without the key";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("absent-key"), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("'present'"), std::string::npos) << e.what();
  }
}

TYPED_TEST(StoreTest, WaitReturnsWhenAllKeysAppear) {
  auto a = this->factory.make();
  auto c = this->factory.make();
  std::thread setter([&] {
    c->set("w1", b("1"));
    std::this_thread::sleep_for(30ms);
    c->set("w2", b("2"));
  });
  a->wait({"w1", "w2"}, 20s);
  EXPECT_TRUE(a->check({"w1", "w2"}));
  setter.join();
}

TYPED_TEST(StoreTest, RemoveAndCheck) {
  auto s = this->factory.make();
  EXPECT_FALSE(s->check({"r"}));
  EXPECT_TRUE(s->check({}));
  s->set("r", b("1"));
  s->set("q", b("1"));
  EXPECT_TRUE(s->check({"r", "q"}));
  EXPECT_TRUE(s->remove("r"));
  EXPECT_FALSE(s->remove("r"));
  EXPECT_FALSE(s->check({"r", "q"}));
  EXPECT_TRUE(s->check({"q"}));
  s->set_timeout(50ms);
  EXPECT_THROW(s->get("r"), TimeoutError);
}

TEST(PrefixStoreTest, KeysLiveUnderThePrefix) {
  auto base = std::make_shared<HashStore>();
  PrefixStore p("ns", base);
  p.set("k", b("v"));
  EXPECT_TRUE(base->check({"ns/k"}));
  EXPECT_FALSE(base->check({"k"}));
  PrefixStore other("other", base);
  EXPECT_FALSE(other.check({"k"}));
}

TEST(HashStoreTest, CloseWakesBlockedGet) {
  HashStore s;
  std::thread closer([&] {
    std::this_thread::sleep_for(50ms);
    s.close();
  });
  EXPECT_THROW(s.get("k", 20s), StoreError);
  closer.join();
}

}  // namespace
}  // namespace meshtrain::comm
