// Elastic membership for `meshrun --nnodes MIN:MAX`: the agents that are present meet in rounds
// held in the rendezvous store. A round closes when MAX nodes joined, when every node expected
// (the previous round's members and the nodes waiting for this one) joined, or when at least
// MIN joined and the last-call period passed since MIN was reached. The closed round fixes the
// members in node-id order; ranks follow densely in that order. An agent that arrives after its
// round closed waits for the next one and says so in the store, so that the running members
// stop their workers (they checkpoint) and open the next round that admits it; a node that
// disappears is simply absent from the next round. Rounds are numbered from 0, the same on
// every agent, and the number doubles as TORCHELASTIC_RESTART_COUNT.
//
// Store keys, under "rdzv/<id>/elastic/": "round" (the open round), and per round R:
// "R/id/<node>" (claims a node id), "R/count" and "R/slot/<k>" (the joins in arrival order),
// "R/members" (the closed member list), "R/waiting" (nodes that arrived too late for R),
// "R/survived/<node>" (the node outlived the failure of round R), "R/left" (members of R that
// left the job for good); and "finished" (the job
// succeeded: nobody waits any longer).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/comm/store.h"

namespace meshtrain::runtime {

struct ElasticOptions {
  std::string rdzv_id = "none";
  int64_t node_id = 0;  // unique among the job's agents; members are ordered by it
  int nproc = 1;        // this node's workers
  std::string host;     // for the log
  int min_nodes = 1;
  int max_nodes = 1;
  // How long a round stays open for more nodes once MIN have joined.
  std::chrono::milliseconds last_call{std::chrono::seconds(3)};
  // How long a round may wait for MIN nodes before the join fails.
  std::chrono::milliseconds join_timeout{std::chrono::seconds(300)};
  std::chrono::milliseconds poll{std::chrono::milliseconds(50)};
};

struct ElasticMember {
  int64_t node_id = 0;
  int nproc = 0;
  std::string host;
};

struct ElasticRound {
  int64_t round = 0;
  std::vector<ElasticMember> members;  // by node id
  int group_rank = 0;                  // this node's index in members
  int rank_base = 0;                   // the first global rank of this node's workers
  int world_size = 0;
  // "round 2: 2 nodes (0 on host-a, 3 on host-b), world size 8"
  std::string describe() const;
};

class ElasticRendezvous {
 public:
  ElasticRendezvous(std::shared_ptr<comm::Store> store, ElasticOptions options);

  // Joins the open round and returns it once it closed with this node as a member, waiting for
  // later rounds while closed ones run without it. nullopt when the job finished meanwhile.
  // TimeoutError when fewer than MIN nodes joined within the join timeout.
  std::optional<ElasticRound> join();
  // Nodes are waiting to join and the round has room for them (the members should stop their
  // workers and open the next round).
  bool nodes_waiting(const ElasticRound& round);
  // Opens the round after `round` (any member may call it; the first call wins).
  void open_next(int64_t round);
  // This member of `round` leaves the job for good (a straggler left out): the next round does
  // not wait for it.
  void leave(int64_t round);
  // After a failed round: this node outlived it (its workers are stopped and it goes on).
  void survived(int64_t round);
  // The members of `round` other than this node that have not said they survived it within
  // `limit`: they died with the round (killed, or their host lost), and the failure was theirs.
  std::vector<int64_t> lost_members(const ElasticRound& round, std::chrono::milliseconds limit);
  void mark_finished();
  bool finished();

 private:
  std::string key(const std::string& suffix) const;
  std::string round_key(int64_t round, const std::string& suffix) const;
  int64_t open_round();
  std::optional<std::vector<ElasticMember>> members(int64_t round);
  // Closes `round` from the joins so far (the first call wins) and returns its members.
  std::vector<ElasticMember> close(int64_t round, int64_t joined);
  // Waits until a round after `round` opens; false when the job finished instead.
  bool wait_for_round_after(int64_t round);

  std::shared_ptr<comm::Store> store_;
  ElasticOptions options_;
};

// "0:4:host;3:4:host" <-> members. ValueError on a malformed list.
std::string encode_members(const std::vector<ElasticMember>& members);
std::vector<ElasticMember> decode_members(const std::string& text);

}  // namespace meshtrain::runtime
