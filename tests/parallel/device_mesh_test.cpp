// The device mesh on real ranks (threads, each with its own shm process group): every sub-group
// of a {pp, dp, tp} mesh must hold exactly the ranks that differ from this one along its
// dimensions, in coordinate order, and every collective must work on it with the values that
// those ranks, and no others, contribute.
#include "meshtrain/parallel/mesh/device_mesh.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "meshtrain/util/error.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel {
namespace {

// Runs every collective of the ProcessGroup interface on `g`, whose members are `members`
// (world ranks in group order), with inputs derived from the world rank, and checks each result.
void exercise(const comm::ProcessGroupPtr& g, const std::vector<int>& members, int world_rank,
              const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_NE(g, nullptr);
  const int n = g->size();
  const int me = g->rank();
  ASSERT_EQ(n, static_cast<int>(members.size()));
  ASSERT_EQ(members[static_cast<size_t>(me)], world_rank);
  const float mine = static_cast<float>(world_rank + 1);
  const float member_sum =
      std::accumulate(members.begin(), members.end(), 0.0f,
                      [](float a, int r) { return a + static_cast<float>(r + 1); });
  // all_reduce
  std::vector<float> v{mine, 2 * mine};
  g->all_reduce(v.data(), 2, DType::f32)->wait();
  EXPECT_EQ(v[0], member_sum);
  EXPECT_EQ(v[1], 2 * member_sum);
  // broadcast from the last member
  float b = mine;
  g->broadcast(&b, 1, DType::f32, {.root = n - 1})->wait();
  EXPECT_EQ(b, static_cast<float>(members.back() + 1));
  // reduce to member 0 (max)
  float r = mine;
  g->reduce(&r, 1, DType::f32, {.root = 0, .op = comm::ReduceOp::max})->wait();
  if (me == 0) {
    EXPECT_EQ(r, static_cast<float>(*std::max_element(members.begin(), members.end()) + 1));
  }
  // all_gather
  std::vector<float> all(static_cast<size_t>(n));
  g->all_gather(&mine, all.data(), 1, DType::f32)->wait();
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(all[static_cast<size_t>(i)], members[static_cast<size_t>(i)] + 1);
  // all_gather_v: member i contributes i + 1 copies of its value
  std::vector<size_t> counts;
  for (int i = 0; i < n; ++i) counts.push_back(static_cast<size_t>(i + 1));
  std::vector<float> in_v(static_cast<size_t>(me + 1), mine);
  std::vector<float> out_v(static_cast<size_t>(n * (n + 1) / 2));
  g->all_gather_v(in_v.data(), out_v.data(), counts, DType::f32)->wait();
  size_t at = 0;
  for (int i = 0; i < n; ++i)
    for (int k = 0; k <= i; ++k) EXPECT_EQ(out_v[at++], members[static_cast<size_t>(i)] + 1);
  // reduce_scatter: block j of member i is (i + 1) * (j + 1); member j gets (j + 1) * n(n+1)/2
  std::vector<float> rs_in(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j)
    rs_in[static_cast<size_t>(j)] = static_cast<float>((me + 1) * (j + 1));
  float rs_out = 0;
  g->reduce_scatter(rs_in.data(), &rs_out, 1, DType::f32)->wait();
  EXPECT_EQ(rs_out, static_cast<float>((me + 1) * n * (n + 1) / 2));
  // gather to member 0, scatter from member 0
  std::vector<float> gathered(static_cast<size_t>(n));
  g->gather(&mine, me == 0 ? gathered.data() : nullptr, 1, DType::f32, {.root = 0})->wait();
  if (me == 0) {
    for (int i = 0; i < n; ++i)
      EXPECT_EQ(gathered[static_cast<size_t>(i)], members[static_cast<size_t>(i)] + 1);
  }
  std::vector<float> sc_in(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    sc_in[static_cast<size_t>(i)] = static_cast<float>(100 * i + members[0]);
  float sc_out = -1;
  g->scatter(me == 0 ? sc_in.data() : nullptr, &sc_out, 1, DType::f32, {.root = 0})->wait();
  EXPECT_EQ(sc_out, static_cast<float>(100 * me + members[0]));
  // all_to_all: block j of member i is 10 * world_rank(i) + j
  std::vector<float> a2a_in(static_cast<size_t>(n)), a2a_out(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j)
    a2a_in[static_cast<size_t>(j)] = static_cast<float>(10 * world_rank + j);
  g->all_to_all(a2a_in.data(), a2a_out.data(), 1, DType::f32)->wait();
  for (int i = 0; i < n; ++i)
    EXPECT_EQ(a2a_out[static_cast<size_t>(i)],
              static_cast<float>(10 * members[static_cast<size_t>(i)] + me));
  // send/recv around the ring of members
  float to_next = mine, from_prev = -1;
  auto s = g->send(&to_next, 1, DType::f32, (me + 1) % n, 7);
  auto rv = g->recv(&from_prev, 1, DType::f32, (me + n - 1) % n, 7);
  rv->wait();
  s->wait();
  EXPECT_EQ(from_prev, static_cast<float>(members[static_cast<size_t>((me + n - 1) % n)] + 1));
  g->barrier()->wait();
}

TEST(DeviceMesh, EveryCollectiveWorksOnEverySubGroupOfAThreeDimensionalMesh) {
  testing::run_shm_ranks(8, [](int rank, const comm::ProcessGroupPtr& world) {
    DeviceMesh mesh(world, {{"pp", 2}, {"dp", 2}, {"tp", 2}}, {{"dp", "tp"}, {"tp", "pp"}});
    ASSERT_EQ(mesh.size(), 8);
    // The last dimension varies fastest: rank = 4 pp + 2 dp + tp.
    EXPECT_EQ(mesh.coord("pp"), rank / 4);
    EXPECT_EQ(mesh.coord("dp"), rank / 2 % 2);
    EXPECT_EQ(mesh.coord("tp"), rank % 2);
    EXPECT_EQ(mesh.rank_of(mesh.coords()), rank);
    const int pp = rank / 4, dp = rank / 2 % 2, tp = rank % 2;
    EXPECT_EQ(mesh.group_ranks({"tp"}), (std::vector<int>{4 * pp + 2 * dp, 4 * pp + 2 * dp + 1}));
    EXPECT_EQ(mesh.group_ranks({"dp"}), (std::vector<int>{4 * pp + tp, 4 * pp + 2 + tp}));
    EXPECT_EQ(mesh.group_ranks({"pp"}), (std::vector<int>{2 * dp + tp, 4 + 2 * dp + tp}));
    EXPECT_EQ(mesh.group_ranks({"tp", "dp"}),
              (std::vector<int>{4 * pp, 4 * pp + 1, 4 * pp + 2, 4 * pp + 3}));
    EXPECT_EQ(mesh.group_ranks({"pp", "tp"}),
              (std::vector<int>{2 * dp, 2 * dp + 1, 4 + 2 * dp, 4 + 2 * dp + 1}));
    for (const std::vector<std::string>& dims : std::vector<std::vector<std::string>>{
             {"pp"}, {"dp"}, {"tp"}, {"dp", "tp"}, {"pp", "tp"}}) {
      std::string what = "rank " + std::to_string(rank) + " group";
      for (const auto& d : dims) what += " " + d;
      exercise(mesh.group(dims), mesh.group_ranks(dims), rank, what);
    }
    // A combination not named at construction is an error, not a hidden collective.
    EXPECT_THROW(mesh.group(std::vector<std::string>{"pp", "dp"}), meshtrain::Error);
    EXPECT_THROW(mesh.coord("ep"), meshtrain::ValueError);
  });
}

TEST(DeviceMesh, DimensionsOfSizeOneHaveNoGroupAndTheWholeWorldIsTheWorldGroup) {
  testing::run_shm_ranks(2, [](int rank, const comm::ProcessGroupPtr& world) {
    DeviceMesh mesh(world, {{"pp", 1}, {"dp", 2}, {"tp", 1}});
    EXPECT_EQ(mesh.group("pp"), nullptr);
    EXPECT_EQ(mesh.group("tp"), nullptr);
    EXPECT_EQ(mesh.group("dp"), world);
    EXPECT_EQ(mesh.coord("dp"), rank);
    EXPECT_EQ(mesh.describe(), "pp=1 x dp=2 x tp=1 (rank " + std::to_string(rank) +
                                   " at pp=0 dp=" + std::to_string(rank) + " tp=0)");
  });
  DeviceMesh alone(nullptr, {{"dp", 1}});
  EXPECT_EQ(alone.size(), 1);
  EXPECT_EQ(alone.group("dp"), nullptr);
}

TEST(DeviceMesh, ALayoutThatDoesNotCoverTheWorldIsOneClearError) {
  try {
    DeviceMesh mesh(nullptr, {{"pp", 2}, {"dp", 1}});
    FAIL() << "a 2-rank mesh was accepted for one process";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("pp=2 x dp=1 has 2 ranks but the job has 1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(DeviceMesh(nullptr, {{"dp", 1}, {"dp", 1}}), Error);
  EXPECT_THROW(DeviceMesh(nullptr, {{"dp", 0}}), Error);
}

}  // namespace
}  // namespace meshtrain::parallel
