#include "meshtrain/parallel/gossip/gossip_graph.h"

#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

GossipGraph parse_gossip_graph(std::string_view name) {
  if (name == "ring") return GossipGraph::ring;
  if (name == "exponential") return GossipGraph::exponential;
  MT_THROW(ValueError, "gossip graph '", name, "' does not exist (ring and exponential do)");
}

std::string_view gossip_graph_name(GossipGraph graph) {
  return graph == GossipGraph::ring ? "ring" : "exponential";
}

int exponential_period(int ranks) {
  int k = 0;
  while ((int64_t{1} << k) < ranks) ++k;
  return k < 1 ? 1 : k;
}

GossipRound gossip_round(GossipGraph graph, int rank, int ranks, int64_t round) {
  MT_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "gossip: rank ", rank, " of ", ranks);
  MT_CHECK(round >= 0, "gossip: round ", round, " is negative");
  GossipRound r;
  if (ranks == 1) {
    r.terms = {rank};
    return r;
  }
  if (ranks == 2) {
    // Both graphs meet the one other rank; the sum in rank order gives both the same bits.
    const int peer = 1 - rank;
    r.sends = {peer};
    r.recvs = {peer};
    r.terms = {0, 1};
    return r;
  }
  if (graph == GossipGraph::ring) {
    const int prev = (rank + ranks - 1) % ranks, next = (rank + 1) % ranks;
    r.sends = {prev, next};
    r.recvs = {prev, next};
    r.terms = {prev, rank, next};
    return r;
  }
  const int k = static_cast<int>(round % exponential_period(ranks));
  const int hop = 1 << k;  // below `ranks`: 2^(ceil(log2 n) - 1) < n
  const int to = (rank + hop) % ranks, from = (rank + ranks - hop) % ranks;
  r.sends = {to};
  r.recvs = {from};
  r.terms = {rank, from};
  return r;
}

}  // namespace meshtrain::parallel
