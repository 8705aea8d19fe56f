// The elastic rendezvous protocol with agents as threads over one in-memory store: how rounds
// close (MAX reached, every expected node present, or MIN plus the last call), dense ranks in
// node-id order, a late node waiting for and getting into the next round, duplicate ids, a
// job that finishes while a node waits, and telling the members that died with a failed round
// from those that outlived it.
#include "meshtrain/runtime/elastic_rendezvous.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

#include "meshtrain/comm/hash_store.h"
#include "meshtrain/util/error.h"
#include "tests/support/wait.h"

namespace meshtrain::runtime {
namespace {

using namespace std::chrono_literals;

ElasticOptions agent(int64_t id, int nproc, int min_nodes, int max_nodes,
                     std::chrono::milliseconds last_call = 200ms) {
  ElasticOptions o;
  o.rdzv_id = "job";
  o.node_id = id;
  o.nproc = nproc;
  o.host = "h" + std::to_string(id);
  o.min_nodes = min_nodes;
  o.max_nodes = max_nodes;
  o.last_call = last_call;
  o.join_timeout = 20s;
  o.poll = 5ms;
  return o;
}

std::future<std::optional<ElasticRound>> join_async(std::shared_ptr<comm::Store> store,
                                                    ElasticOptions o) {
  return std::async(std::launch::async, [store, o] { return ElasticRendezvous(store, o).join(); });
}

TEST(ElasticRendezvous, RoundClosesAtMaxWithDenseRanksInNodeOrder) {
  auto store = std::make_shared<comm::HashStore>();
  // A long last call: the round can only close because MAX nodes joined.
  auto c = join_async(store, agent(7, 1, 1, 3, 60s));
  auto a = join_async(store, agent(2, 2, 1, 3, 60s));
  auto b = join_async(store, agent(5, 3, 1, 3, 60s));
  const auto ra = a.get(), rb = b.get(), rc = c.get();
  ASSERT_TRUE(ra && rb && rc);
  EXPECT_EQ(ra->round, 0);
  EXPECT_EQ(ra->world_size, 6);
  EXPECT_EQ(rb->world_size, 6);
  EXPECT_EQ(ra->group_rank, 0);
  EXPECT_EQ(ra->rank_base, 0);
  EXPECT_EQ(rb->group_rank, 1);
  EXPECT_EQ(rb->rank_base, 2);
  EXPECT_EQ(rc->group_rank, 2);
  EXPECT_EQ(rc->rank_base, 5);
  EXPECT_EQ(encode_members(ra->members), encode_members(rc->members));
  EXPECT_NE(ra->describe().find("round 0: 3 nodes (2 on h2, 5 on h5, 7 on h7), world size 6"),
            std::string::npos)
      << ra->describe();
}

TEST(ElasticRendezvous, RoundClosesWithMinNodesAfterTheLastCall) {
  auto store = std::make_shared<comm::HashStore>();
  const auto start = std::chrono::steady_clock::now();
  auto r = ElasticRendezvous(store, agent(0, 2, 1, 4, 300ms)).join();
  ASSERT_TRUE(r);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  EXPECT_EQ(r->members.size(), 1u);
  EXPECT_EQ(r->world_size, 2);
}

TEST(ElasticRendezvous, LateNodeWaitsAndTheNextRoundAdmitsIt) {
  auto store = std::make_shared<comm::HashStore>();
  ElasticRendezvous first(store, agent(0, 2, 1, 2, 100ms));
  auto r0 = first.join();
  ASSERT_TRUE(r0);
  ASSERT_EQ(r0->world_size, 2);
  EXPECT_FALSE(first.nodes_waiting(*r0));

  auto late = join_async(store, agent(1, 2, 1, 2, 60s));
  ASSERT_TRUE(meshtrain::testing::wait_until([&] { return first.nodes_waiting(*r0); }, 10s));
  // The member stops its workers and opens the next round; both nodes meet there.
  first.open_next(r0->round);
  first.open_next(r0->round);  // a second member's call changes nothing
  auto r1 = first.join();
  auto r1_late = late.get();
  ASSERT_TRUE(r1 && r1_late);
  EXPECT_EQ(r1->round, 1);
  EXPECT_EQ(r1_late->round, 1);
  EXPECT_EQ(r1->world_size, 4);
  EXPECT_EQ(r1_late->group_rank, 1);
  EXPECT_EQ(r1_late->rank_base, 2);
  // Full: a third node would wait without disturbing the round.
  EXPECT_FALSE(first.nodes_waiting(*r1));
}

TEST(ElasticRendezvous, ANodeThatLeftIsAbsentFromTheNextRound) {
  auto store = std::make_shared<comm::HashStore>();
  auto a = join_async(store, agent(0, 1, 1, 2, 60s));
  auto b = join_async(store, agent(1, 1, 1, 2, 60s));
  auto ra = a.get();
  ASSERT_TRUE(ra && b.get());
  ASSERT_EQ(ra->world_size, 2);
  // Node 1 is gone; node 0 opens round 1 and, after the last call, runs alone.
  ElasticRendezvous survivor(store, agent(0, 1, 1, 2, 200ms));
  survivor.open_next(ra->round);
  auto r1 = survivor.join();
  ASSERT_TRUE(r1);
  EXPECT_EQ(r1->round, 1);
  EXPECT_EQ(r1->world_size, 1);
}

// A member that says it leaves for good (a straggler left out) is not waited for: the next round
// closes on the members that remain, long before the last call.
TEST(ElasticRendezvous, AMemberThatLeavesIsNotWaitedFor) {
  auto store = std::make_shared<comm::HashStore>();
  auto a = join_async(store, agent(0, 1, 1, 3, 45s));
  auto b = join_async(store, agent(1, 1, 1, 3, 45s));
  auto c = join_async(store, agent(2, 1, 1, 3, 45s));
  auto ra = a.get();
  ASSERT_TRUE(ra && b.get() && c.get());
  ASSERT_EQ(ra->world_size, 3);
  ElasticRendezvous(store, agent(1, 1, 1, 3, 45s)).leave(ra->round);
  const auto start = std::chrono::steady_clock::now();
  ElasticRendezvous x(store, agent(0, 1, 1, 3, 45s)), y(store, agent(2, 1, 1, 3, 45s));
  x.open_next(ra->round);
  auto r0 = std::async(std::launch::async, [&] { return x.join(); });
  auto r2 = std::async(std::launch::async, [&] { return y.join(); });
  const auto j0 = r0.get(), j2 = r2.get();
  ASSERT_TRUE(j0 && j2);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 20s);
  EXPECT_EQ(j0->round, 1);
  EXPECT_EQ(encode_members(j0->members), "0 1 h0;2 1 h2");
  EXPECT_EQ(j2->group_rank, 1);
}

TEST(ElasticRendezvous, MembersThatDidNotOutliveAFailedRoundAreLost) {
  auto store = std::make_shared<comm::HashStore>();
  auto a = join_async(store, agent(0, 1, 1, 3, 60s));
  auto b = join_async(store, agent(1, 1, 1, 3, 60s));
  auto c = join_async(store, agent(2, 1, 1, 3, 60s));
  const auto ra = a.get(), rb = b.get(), rc = c.get();
  ASSERT_TRUE(ra && rb && rc);
  // The round failed: nodes 0 and 1 go on, node 2 died with it.
  ElasticRendezvous n0(store, agent(0, 1, 1, 3)), n1(store, agent(1, 1, 1, 3));
  n0.survived(ra->round);
  const auto start = std::chrono::steady_clock::now();
  // Node 1 answers while node 0 waits: once node 0's thread is asleep in lost_members.
  const pid_t waiter = testing::current_tid();
  auto later = std::async(std::launch::async, [&] {
    EXPECT_TRUE(testing::wait_until([&] { return testing::thread_is_asleep(waiter); }, 10s));
    n1.survived(rb->round);
  });
  // Node 1 answers within the limit, node 2 never does.
  EXPECT_EQ(n0.lost_members(*ra, 300ms), (std::vector<int64_t>{2}));
  EXPECT_GE(std::chrono::steady_clock::now() - start, 300ms);
  later.get();
  EXPECT_EQ(n1.lost_members(*rb, 10ms), (std::vector<int64_t>{2}));
  ElasticRendezvous n2(store, agent(2, 1, 1, 3));
  n2.survived(rc->round);
  // Nobody is missing any more: the answer comes at once.
  const auto quick = std::chrono::steady_clock::now();
  EXPECT_TRUE(n0.lost_members(*ra, 10s).empty());
  EXPECT_LT(std::chrono::steady_clock::now() - quick, 5s);
}

TEST(ElasticRendezvous, DuplicateNodeIdIsRejected) {
  auto store = std::make_shared<comm::HashStore>();
  auto a = join_async(store, agent(3, 1, 2, 2, 60s));
  // The second agent with id 3 comes once the first has claimed the id in round 0.
  ASSERT_NO_THROW(store->wait({"rdzv/job/elastic/0/id/3"}, 10s));
  EXPECT_THROW(ElasticRendezvous(store, agent(3, 1, 2, 2)).join(), ValueError);
  auto b = join_async(store, agent(4, 1, 2, 2, 60s));
  EXPECT_TRUE(a.get() && b.get());
}

TEST(ElasticRendezvous, WaitingNodeReturnsWhenTheJobFinishes) {
  auto store = std::make_shared<comm::HashStore>();
  ElasticRendezvous member(store, agent(0, 1, 1, 2, 50ms));
  const auto r0 = member.join();
  ASSERT_TRUE(r0);
  auto late = join_async(store, agent(1, 1, 1, 2));
  // The job finishes while the late node waits for the next round (it said so in round 0).
  ASSERT_TRUE(meshtrain::testing::wait_until([&] { return member.nodes_waiting(*r0); }, 10s));
  member.mark_finished();
  EXPECT_FALSE(late.get().has_value());
}

TEST(ElasticRendezvous, TooFewNodesTimeOut) {
  auto store = std::make_shared<comm::HashStore>();
  ElasticOptions o = agent(0, 1, 2, 3);
  o.join_timeout = 200ms;
  EXPECT_THROW(ElasticRendezvous(store, o).join(), TimeoutError);
}

TEST(ElasticRendezvous, MemberListRoundTripsAndRejectsGarbage) {
  std::vector<ElasticMember> m = {{0, 4, "a"}, {3, 2, "b"}};
  const auto back = decode_members(encode_members(m));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].node_id, 3);
  EXPECT_EQ(back[1].nproc, 2);
  EXPECT_EQ(back[1].host, "b");
  EXPECT_THROW(decode_members("x y z"), ValueError);
  EXPECT_THROW(decode_members("1 0 h"), ValueError);
  EXPECT_THROW(decode_members(""), ValueError);
}

}  // namespace
}  // namespace meshtrain::runtime
