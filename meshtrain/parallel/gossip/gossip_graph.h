// Who averages with whom at each gossip round: a pure function of (graph, rank, ranks, round),
// so that every rank derives its part of the same round without communication, and a test can
// check for every world size that each send has its receive.
//
//   ring:        rank i averages with i - 1 and i + 1 (mod n): x_i <- (x_{i-1} + x_i + x_{i+1}) /
//   3;
//                with 2 ranks the two neighbours are one rank, and both take the mean of the two.
//   exponential: at round t rank i sends to i + 2^k and receives from i - 2^k (mod n), with
//                k = t mod ceil(log2 n): x_i <- (x_i + x_{i-2^k}) / 2. One peer a round, and
//                after ceil(log2 n) rounds every rank has heard from every other (the one-peer
//                exponential graph of Stochastic Gradient Push, Assran et al. 2019).
//
// Both mixings are doubly stochastic, so the mean of the replicas is kept (up to rounding).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::parallel {

enum class GossipGraph { ring, exponential };

// "ring" or "exponential"; ValueError for anything else.
GossipGraph parse_gossip_graph(std::string_view name);
std::string_view gossip_graph_name(GossipGraph graph);

// One rank's part of one round.
struct GossipRound {
  std::vector<int> sends;  // ranks that receive this rank's parameters, once each
  std::vector<int> recvs;  // ranks whose parameters this rank receives, once each
  // The ranks whose parameters are added up, in this order (this rank's own included), before
  // dividing by their count: a fixed order makes every run give the same bits.
  std::vector<int> terms;
};

// Rank `rank` of `ranks` at round `round` (0-based, one per update). One rank: nothing to do.
GossipRound gossip_round(GossipGraph graph, int rank, int ranks, int64_t round);

// The number of distinct peers the exponential graph cycles through: ceil(log2 ranks), at least 1.
int exponential_period(int ranks);

}  // namespace meshtrain::parallel
