// The gossip graphs as the pure function they are: for every world size from 2 to 8 and every
// round of a period, each rank's sends meet exactly one receive on the other side, the
// neighbours are the ones the formulas name, each mixing keeps the replicas' mean (doubly
// stochastic), and the exponential graph's rounds of one period reach every rank from every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "meshtrain/parallel/gossip/gossip_graph.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {
namespace {

constexpr GossipGraph kGraphs[] = {GossipGraph::ring, GossipGraph::exponential};

std::vector<GossipRound> all_ranks(GossipGraph g, int n, int64_t round) {
  std::vector<GossipRound> out;
  for (int r = 0; r < n; ++r) out.push_back(gossip_round(g, r, n, round));
  return out;
}

TEST(GossipGraph, EverySendPairsWithOneReceive) {
  for (GossipGraph g : kGraphs)
    for (int n = 2; n <= 8; ++n)
      for (int64_t t = 0; t < 2 * exponential_period(n) + 1; ++t) {
        SCOPED_TRACE(std::string(gossip_graph_name(g)) + " n=" + std::to_string(n) +
                     " round=" + std::to_string(t));
        const auto rounds = all_ranks(g, n, t);
        std::map<std::pair<int, int>, int> sent, received;  // (from, to) -> count
        for (int r = 0; r < n; ++r) {
          const GossipRound& x = rounds[static_cast<size_t>(r)];
          for (int to : x.sends) {
            ASSERT_NE(to, r);
            ASSERT_TRUE(to >= 0 && to < n);
            ++sent[{r, to}];
          }
          for (int from : x.recvs) {
            ASSERT_NE(from, r);
            ASSERT_TRUE(from >= 0 && from < n);
            ++received[{from, r}];
          }
          // The sum takes this rank once and every rank it receives from once.
          std::vector<int> terms = x.terms, want = x.recvs;
          want.push_back(r);
          std::sort(terms.begin(), terms.end());
          std::sort(want.begin(), want.end());
          EXPECT_EQ(terms, want);
        }
        EXPECT_EQ(sent, received);
        for (const auto& [pair, count] : sent) EXPECT_EQ(count, 1);
      }
}

TEST(GossipGraph, RingAveragesWithBothNeighbours) {
  for (int n = 3; n <= 8; ++n)
    for (int r = 0; r < n; ++r) {
      const GossipRound x = gossip_round(GossipGraph::ring, r, n, 5);
      const int prev = (r + n - 1) % n, next = (r + 1) % n;
      EXPECT_EQ(x.terms, (std::vector<int>{prev, r, next})) << n << " " << r;
      EXPECT_EQ(x.sends, (std::vector<int>{prev, next}));
      EXPECT_EQ(x.recvs, (std::vector<int>{prev, next}));
    }
  // Two ranks: the one neighbour is both, and both sum in rank order (the same bits).
  for (GossipGraph g : kGraphs)
    for (int r = 0; r < 2; ++r) {
      const GossipRound x = gossip_round(g, r, 2, 3);
      EXPECT_EQ(x.sends, std::vector<int>{1 - r});
      EXPECT_EQ(x.recvs, std::vector<int>{1 - r});
      EXPECT_EQ(x.terms, (std::vector<int>{0, 1}));
    }
}

TEST(GossipGraph, ExponentialPeerDoublesEachRound) {
  EXPECT_EQ(exponential_period(2), 1);
  EXPECT_EQ(exponential_period(3), 2);
  EXPECT_EQ(exponential_period(4), 2);
  EXPECT_EQ(exponential_period(5), 3);
  EXPECT_EQ(exponential_period(8), 3);
  for (int n = 3; n <= 8; ++n)
    for (int64_t t = 0; t < 7; ++t)
      for (int r = 0; r < n; ++r) {
        const int hop = 1 << (t % exponential_period(n));
        const GossipRound x = gossip_round(GossipGraph::exponential, r, n, t);
        EXPECT_EQ(x.sends, std::vector<int>{(r + hop) % n}) << n << " " << t << " " << r;
        EXPECT_EQ(x.recvs, std::vector<int>{(r - hop + n) % n});
        EXPECT_EQ(x.terms, (std::vector<int>{r, (r - hop + n) % n}));
      }
  // 8 ranks, rank 3: peers 4, 5, 7, then 4 again.
  std::vector<int> to;
  for (int64_t t = 0; t < 4; ++t)
    to.push_back(gossip_round(GossipGraph::exponential, 3, 8, t).sends[0]);
  EXPECT_EQ(to, (std::vector<int>{4, 5, 7, 4}));
}

// The mixing matrix of a round: row i weighs the terms of rank i equally.
std::vector<std::vector<double>> mixing(GossipGraph g, int n, int64_t t) {
  std::vector<std::vector<double>> w(static_cast<size_t>(n), std::vector<double>(n, 0.0));
  for (int i = 0; i < n; ++i) {
    const GossipRound x = gossip_round(g, i, n, t);
    for (int j : x.terms) w[i][j] += 1.0 / static_cast<double>(x.terms.size());
  }
  return w;
}

TEST(GossipGraph, MixingKeepsTheMeanAndReachesEveryRank) {
  for (GossipGraph g : kGraphs)
    for (int n = 2; n <= 8; ++n) {
      SCOPED_TRACE(std::string(gossip_graph_name(g)) + " n=" + std::to_string(n));
      // reach[i][j]: rank j's value has entered rank i's.
      std::vector<std::vector<bool>> reach(n, std::vector<bool>(n, false));
      for (int i = 0; i < n; ++i) reach[i][i] = true;
      const int rounds = g == GossipGraph::ring ? n / 2 : exponential_period(n);
      for (int64_t t = 0; t < rounds; ++t) {
        const auto w = mixing(g, n, t);
        for (int j = 0; j < n; ++j) {
          double row = 0, column = 0;
          for (int i = 0; i < n; ++i) {
            row += w[j][i];
            column += w[i][j];
          }
          EXPECT_NEAR(row, 1.0, 1e-12) << "round " << t << " rank " << j;
          EXPECT_NEAR(column, 1.0, 1e-12) << "round " << t << " rank " << j;
        }
        auto next = reach;
        for (int i = 0; i < n; ++i)
          for (int k = 0; k < n; ++k)
            if (w[i][k] > 0)
              for (int j = 0; j < n; ++j) next[i][j] = next[i][j] || reach[k][j];
        reach = next;
      }
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) EXPECT_TRUE(reach[i][j]) << j << " never reached " << i;
    }
}

TEST(GossipGraph, OneRankExchangesNothingAndNamesParse) {
  for (GossipGraph g : kGraphs) {
    const GossipRound x = gossip_round(g, 0, 1, 0);
    EXPECT_TRUE(x.sends.empty());
    EXPECT_TRUE(x.recvs.empty());
    EXPECT_EQ(x.terms, std::vector<int>{0});
    EXPECT_EQ(parse_gossip_graph(gossip_graph_name(g)), g);
  }
  EXPECT_THROW(parse_gossip_graph("torus"), ValueError);
  EXPECT_THROW(gossip_round(GossipGraph::ring, 4, 4, 0), Error);
}

}  // namespace
}  // namespace meshtrain::parallel
