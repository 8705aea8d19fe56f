// EtcdStore against real etcd servers on loopback (the shared Store semantics are checked in
// store_test.cpp): binary values, job prefixes, endpoint parsing, the error that names every
// unreachable member, and the reason the backend exists -- a three-member cluster whose first
// member is killed keeps serving set, get, add, compare_set and wait, including a wait and
// adds that were in flight when it died.
#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>

#include "meshtrain/comm/etcd_store.h"
#include "meshtrain/comm/socket.h"
#include "meshtrain/util/error.h"
#include "tests/store/etcd_cluster.h"
#include "tests/support/wait.h"

namespace meshtrain::comm {
namespace {

using namespace std::chrono_literals;
using meshtrain::testing::EtcdCluster;

Bytes b(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

std::shared_ptr<EtcdStore> make_store(const std::vector<std::string>& endpoints,
                                      const std::string& prefix, Duration timeout = 20s) {
  EtcdStoreOptions o;
  o.endpoints = endpoints;
  o.prefix = prefix;
  o.timeout = timeout;
  o.connect_timeout = 500ms;
  return std::make_shared<EtcdStore>(o);
}

TEST(EtcdStoreTest, ParsesEndpointListsAndJobPrefixes) {
  EXPECT_EQ(parse_etcd_endpoints(" h1:2379, h2:2380,https://h3:2379"),
            (std::vector<std::string>{"h1:2379", "h2:2380", "https://h3:2379"}));
  EXPECT_THROW(parse_etcd_endpoints(""), ValueError);
  EXPECT_THROW(parse_etcd_endpoints("h1:2379,,h2:2379"), ValueError);
  EXPECT_THROW(parse_etcd_endpoints("h1"), ValueError);
  EXPECT_EQ(etcd_job_prefix("run-7"), "meshtrain/run-7/");
  EXPECT_THROW(etcd_job_prefix(""), ValueError);
}

TEST(EtcdStoreTest, UnreachableMembersAreAllNamed) {
  // Ports that were free a moment ago: nothing listens there.
  uint16_t p1 = Socket::listen("127.0.0.1", 0).local_port();
  uint16_t p2 = Socket::listen("127.0.0.1", 0).local_port();
  const std::string e1 = "127.0.0.1:" + std::to_string(p1);
  const std::string e2 = "127.0.0.1:" + std::to_string(p2);
  auto s = make_store({e1, e2}, "meshtrain/unreachable/", 300ms);
  try {
    s->set("k", b("v"));
    FAIL() << "set succeeded without a server";
  } catch (const CommError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot reach etcd at " + e1 + ", " + e2), std::string::npos) << what;
    EXPECT_NE(what.find(e2 + ": "), std::string::npos) << what;
  }
}

TEST(EtcdStoreTest, BinaryValuesOfEveryLengthRoundTrip) {
  EtcdCluster cluster(1);
  auto s = make_store(cluster.endpoints(), "meshtrain/binary/");
  // Every base64 padding case, and every byte value.
  for (size_t len = 0; len < 7; ++len) {
    Bytes v;
    for (size_t i = 0; i < len; ++i) v.push_back(static_cast<uint8_t>(0xFF - 37 * i));
    s->set("len" + std::to_string(len), v);
    EXPECT_EQ(s->get("len" + std::to_string(len)), v) << len;
  }
  Bytes all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<uint8_t>(i));
  s->set("all", all);
  EXPECT_EQ(s->get("all"), all);
  // Keys are bytes too.
  s->set("key with spaces/\xC3\xA9", b("x"));
  EXPECT_TRUE(s->check({"key with spaces/\xC3\xA9"}));
}

TEST(EtcdStoreTest, JobsWithDifferentIdsDoNotSeeEachOther) {
  EtcdCluster cluster(1);
  auto a = make_store(cluster.endpoints(), etcd_job_prefix("job-a"));
  auto c = make_store(cluster.endpoints(), etcd_job_prefix("job-b"));
  a->set("k", b("from a"));
  EXPECT_EQ(a->add("n", 3), 3);
  EXPECT_FALSE(c->check({"k"}));
  EXPECT_EQ(c->add("n", 1), 1);
  c->set("k", b("from b"));
  EXPECT_EQ(a->get("k"), b("from a"));
  EXPECT_TRUE(c->remove("k"));
  EXPECT_EQ(a->get("k"), b("from a"));
}

TEST(EtcdStoreTest, KeepsWorkingWhenTheFirstMemberDies) {
  EtcdCluster cluster(3);
  const std::string prefix = etcd_job_prefix("failover");
  // Every handle lists the member that will die first, so that it is the one they use.
  auto a = make_store(cluster.endpoints(), prefix);
  auto waiter = make_store(cluster.endpoints(), prefix);
  a->set("before", b("1"));
  EXPECT_EQ(a->add("count", 1), 1);
  EXPECT_TRUE(waiter->check({"before"}));

  // A wait that is watching through the first member when it dies.
  std::atomic<bool> waited{false};
  std::string wait_error;
  std::thread wait_thread([&] {
    try {
      waiter->wait({"after"}, 20s);
      waited = true;
    } catch (const std::exception& e) {
      wait_error = e.what();
    }
  });
  // Adds from several handles that are in flight when it dies: none may be lost or doubled. Each
  // thread adds without pause until the member is dead, and kAdds more after that, so adds are
  // in flight at the kill whatever the timing.
  constexpr int kThreads = 4;
  constexpr int kAdds = 30;
  std::vector<std::shared_ptr<EtcdStore>> adders;
  for (int t = 0; t < kThreads; ++t) adders.push_back(make_store(cluster.endpoints(), prefix));
  std::vector<std::vector<int64_t>> seen(kThreads);
  std::vector<std::string> add_errors(kThreads);
  std::atomic<int> added{0};
  std::atomic<bool> killed{false};
  std::vector<std::thread> add_threads;
  for (int t = 0; t < kThreads; ++t) {
    add_threads.emplace_back([&, t] {
      try {
        while (!killed.load()) {
          seen[t].push_back(adders[t]->add("total", 1));
          added.fetch_add(1);
        }
        for (int i = 0; i < kAdds; ++i) seen[t].push_back(adders[t]->add("total", 1));
      } catch (const std::exception& e) {
        add_errors[t] = e.what();
      }
    });
  }
  // Every thread is adding (at least kThreads * 5 adds went through) when the member dies.
  const bool adding = meshtrain::testing::wait_until([&] { return added.load() >= kThreads * 5; },
                                                     std::chrono::milliseconds(20000));
  cluster.kill(0);
  killed = true;

  for (auto& th : add_threads) th.join();
  ASSERT_TRUE(adding) << "the adds did not get going before the kill";
  for (const auto& e : add_errors) EXPECT_EQ(e, "");
  size_t total = 0;
  for (const auto& v : seen) total += v.size();
  EXPECT_GE(total, size_t(kThreads * kAdds));
  EXPECT_EQ(a->add("total", 0), static_cast<int64_t>(total));
  std::set<int64_t> distinct;
  for (const auto& v : seen) distinct.insert(v.begin(), v.end());
  EXPECT_EQ(distinct.size(), total);

  a->set("after", b("2"));
  wait_thread.join();
  EXPECT_TRUE(waited) << wait_error;

  EXPECT_EQ(a->get("before"), b("1"));
  EXPECT_EQ(a->add("count", 1), 2);
  EXPECT_EQ(a->compare_set("cs", {}, b("x")), b("x"));
  EXPECT_EQ(a->compare_set("cs", b("y"), b("z")), b("x"));
  EXPECT_TRUE(a->remove("before"));
  EXPECT_FALSE(a->check({"before"}));

  // A handle made after the loss, with the dead member first in its list, works at once.
  auto late = make_store(cluster.endpoints(), prefix);
  EXPECT_EQ(late->get("after"), b("2"));
  EXPECT_EQ(late->add("count", 1), 3);
  late->set_timeout(200ms);
  EXPECT_THROW(late->get("never"), TimeoutError);
}

}  // namespace
}  // namespace meshtrain::comm
