// Placement properties (one node when the job fits, TP groups inside NVLink islands, fewest
// nodes, one rack, preemption), inventory checks, and the simulator against round-robin and
// first-fit on a synthetic 64 x 8 cluster.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "meshtrain/plan/simulator.h"
#include "meshtrain/util/error.h"

namespace meshtrain::plan {
namespace {

JobRequest job(const std::string& name, int64_t dp, int64_t tp, int64_t pp, int64_t prio = 0) {
  JobRequest j;
  j.name = name;
  j.dp = dp;
  j.tp = tp;
  j.pp = pp;
  j.priority = prio;
  return j;
}

std::set<int> nodes_of(const Placement& p) {
  std::set<int> s;
  for (const DeviceRef& r : p.ranks) s.insert(r.node);
  return s;
}

TEST(Placement, OneNodeWhenItFitsAndTheFullestSuch) {
  Inventory inv = synthetic_inventory(1, 3, 8, 8);
  inv.nodes[1].used = {0, 1, 2, 3};  // node 1 has 4 free: the best fit for a 4-device job
  ClusterState s(inv);
  auto p = s.place(job("a", 4, 1, 1), Policy::kTopology);
  ASSERT_TRUE(p);
  EXPECT_EQ(nodes_of(*p), std::set<int>{1});
  auto q = s.place(job("b", 8, 1, 1), Policy::kTopology);
  ASSERT_TRUE(q);
  EXPECT_EQ(nodes_of(*q).size(), 1u);
  EXPECT_EQ(s.free_devices(), 8);
}

TEST(Placement, TensorParallelGroupsStayInsideAnIsland) {
  // Nodes of 8 devices in two NVLink islands of 4; a device busy in each island of node 0.
  Inventory inv = synthetic_inventory(1, 2, 8, 4);
  inv.nodes[0].used = {0, 5};
  ClusterState s(inv);
  // tp 4 x dp 2: node 0 has 6 free but no island with 4 free; node 1 holds both groups.
  auto p = s.place(job("tp", 2, 4, 1), Policy::kTopology);
  ASSERT_TRUE(p);
  for (size_t g = 0; g < 2; ++g) {
    std::set<int> islands;
    for (size_t k = 0; k < 4; ++k) {
      const DeviceRef& r = p->ranks[g * 4 + k];
      EXPECT_EQ(r.node, p->ranks[g * 4].node);
      islands.insert(r.device / 4);
    }
    EXPECT_EQ(islands.size(), 1u) << "TP group " << g << " split across islands";
  }
  // First-fit would have split a group across node 0's islands.
  ClusterState ff(inv);
  auto f = ff.place(job("tp", 2, 4, 1), Policy::kFirstFit);
  ASSERT_TRUE(f);
  EXPECT_EQ(f->ranks[0].node, 0);
}

TEST(Placement, FewestNodesInOneRack) {
  // 2 racks of 4 nodes; rack 0 is half busy. A 24-device job needs 3 whole nodes: rack 1.
  Inventory inv = synthetic_inventory(2, 4, 8, 8);
  for (int n = 0; n < 4; ++n) inv.nodes[static_cast<size_t>(n)].used = {0, 1, 2, 3};
  ClusterState s(inv);
  auto p = s.place(job("big", 3, 8, 1), Policy::kTopology);
  ASSERT_TRUE(p);
  EXPECT_EQ(nodes_of(*p).size(), 3u);
  for (int n : nodes_of(*p)) EXPECT_EQ(inv.nodes[static_cast<size_t>(n)].rack, "rack1");
  // Each node holds consecutive ranks (what meshrun needs).
  for (size_t r = 1; r < p->ranks.size(); ++r)
    if (p->ranks[r].node != p->ranks[r - 1].node) {
      EXPECT_EQ(r % 8, 0u);
    }
  const std::string cmds = meshrun_commands(inv, *p);
  EXPECT_EQ(cmds.find("not consecutive"), std::string::npos) << cmds;
  EXPECT_NE(cmds.find("--nnodes 3 --node-rank 2 --nproc-per-node 8"), std::string::npos) << cmds;
  EXPECT_NE(hostfile(inv, *p).find("r1n"), std::string::npos);
  EXPECT_NE(node_affinity_yaml(inv, *p).find("kubernetes.io/hostname"), std::string::npos);
}

TEST(Placement, HigherPriorityPreemptsTheLowestFirst) {
  ClusterState s(synthetic_inventory(1, 2, 8, 8));
  ASSERT_TRUE(s.place(job("low", 8, 1, 1, 0), Policy::kTopology));
  ASSERT_TRUE(s.place(job("mid", 8, 1, 1, 1), Policy::kTopology));
  EXPECT_FALSE(s.place(job("same", 8, 1, 1, 0), Policy::kTopology, true));  // no lower job
  auto p = s.place(job("high", 8, 1, 1, 2), Policy::kTopology, true);
  ASSERT_TRUE(p);
  EXPECT_EQ(p->preempted, std::vector<std::string>{"low"});
  EXPECT_EQ(s.running().count("low"), 0u);
  EXPECT_EQ(s.running().count("mid"), 1u);
  // Nothing is preempted when even all lower jobs would not make room.
  EXPECT_FALSE(s.place(job("huge", 24, 1, 1, 5), Policy::kTopology, true));
  EXPECT_EQ(s.running().size(), 2u);
}

TEST(Placement, InventoryContradictionsAreOneLine) {
  const auto dir = std::filesystem::temp_directory_path() / ("mt_inv_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  auto expect_error = [&](const std::string& text, const std::string& needle) {
    std::ofstream(dir / "inv.toml") << text;
    try {
      load_inventory((dir / "inv.toml").string());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error("[[node]]\nname = \"a\"\ndevices = 8\nislands = [4, 2]\n",
               "node a: islands add up to 6 devices but the node has 8");
  expect_error("[[node]]\nname = \"a\"\ndevices = 8\nused = [8]\n", "used device 8 does not exist");
  expect_error("[[node]]\nname = \"a\"\n[[node]]\nname = \"a\"\n", "node a is listed twice");
  expect_error("[[node]]\nname = \"a\"\ngpus = 8\n", "unknown key gpus");
  std::ofstream(dir / "inv.toml") << "[[node]]\nname = \"a\"\nrack = \"r\"\ndevices = 4\n";
  EXPECT_EQ(load_inventory((dir / "inv.toml").string()).nodes[0].devices, 4);
  std::filesystem::remove_all(dir);
}

TEST(Simulator, TopologyCutsCrossRackTrafficAtEqualUtilisation) {
  const Inventory inv = synthetic_inventory(4, 16, 8, 8);  // 64 nodes x 8 in 4 racks
  const auto trace = synthetic_trace(300, 7, 0.9, 512);
  const SimResult topo = simulate(inv, trace, Policy::kTopology);
  const SimResult rr = simulate(inv, trace, Policy::kRoundRobin);
  const SimResult ff = simulate(inv, trace, Policy::kFirstFit);
  for (const SimResult* r : {&topo, &rr, &ff})
    std::printf(
        "%-12s utilisation %.3f  mean wait %7.0f s  cross-node %.3g B/step  cross-rack %.3g "
        "B/step (of %.3g)\n",
        r->policy.c_str(), r->utilisation, r->mean_wait, r->cross_node_bytes, r->cross_rack_bytes,
        r->total_bytes);
  EXPECT_LT(topo.cross_rack_bytes, rr.cross_rack_bytes);
  EXPECT_LT(topo.cross_rack_bytes, ff.cross_rack_bytes);
  EXPECT_LT(topo.cross_node_bytes, rr.cross_node_bytes);
  EXPECT_LT(topo.cross_node_bytes, ff.cross_node_bytes);
  // Equal or better utilisation (the same trace, so the same busy device-seconds: a shorter
  // makespan is a higher utilisation).
  EXPECT_GE(topo.utilisation, rr.utilisation * 0.99);
  EXPECT_GE(topo.utilisation, ff.utilisation * 0.99);
}

}  // namespace
}  // namespace meshtrain::plan
