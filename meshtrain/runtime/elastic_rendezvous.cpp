// See elastic_rendezvous.h. Every agent may close a round: the closing decision is a
// compare_set on the member list, so concurrent closers agree on the first list written, and a
// node whose join landed after that list simply finds itself absent and waits for the next round.
#include "meshtrain/runtime/elastic_rendezvous.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <thread>

#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::runtime {
namespace {

comm::Bytes to_bytes(const std::string& s) {
  return comm::Bytes(s.begin(), s.end());
}

std::string member_text(const ElasticMember& m) {
  return detail::str_cat(m.node_id, " ", m.nproc, " ", m.host.empty() ? "?" : m.host);
}

ElasticMember parse_member(const std::string& text) {
  std::istringstream in(text);
  ElasticMember m;
  if (!(in >> m.node_id >> m.nproc >> m.host) || m.node_id < 0 || m.nproc < 1)
    MT_THROW(ValueError, "malformed rendezvous member '", text, "'");
  return m;
}

}  // namespace

std::string encode_members(const std::vector<ElasticMember>& members) {
  std::string out;
  for (const auto& m : members) {
    if (!out.empty()) out.push_back(';');
    out += member_text(m);
  }
  return out;
}

std::vector<ElasticMember> decode_members(const std::string& text) {
  std::vector<ElasticMember> out;
  std::istringstream in(text);
  for (std::string item; std::getline(in, item, ';');) out.push_back(parse_member(item));
  if (out.empty()) MT_THROW(ValueError, "empty rendezvous member list");
  return out;
}

std::string ElasticRound::describe() const {
  std::string list;
  for (const auto& m : members) {
    if (!list.empty()) list += ", ";
    list += detail::str_cat(m.node_id, " on ", m.host);
  }
  return detail::str_cat("round ", round, ": ", members.size(),
                         members.size() == 1 ? " node (" : " nodes (", list, "), world size ",
                         world_size);
}

ElasticRendezvous::ElasticRendezvous(std::shared_ptr<comm::Store> store, ElasticOptions options)
    : store_(std::move(store)), options_(std::move(options)) {
  MT_CHECK(store_ != nullptr, "elastic rendezvous without a store");
  if (options_.min_nodes < 1 || options_.max_nodes < options_.min_nodes)
    MT_THROW(ValueError, "--nnodes MIN:MAX needs 1 <= MIN <= MAX, got ", options_.min_nodes, ":",
             options_.max_nodes);
  if (options_.node_id < 0) MT_THROW(ValueError, "negative node id ", options_.node_id);
}

std::string ElasticRendezvous::key(const std::string& suffix) const {
  return detail::str_cat("rdzv/", options_.rdzv_id, "/elastic/", suffix);
}

std::string ElasticRendezvous::round_key(int64_t round, const std::string& suffix) const {
  return key(detail::str_cat(round, "/", suffix));
}

int64_t ElasticRendezvous::open_round() {
  // add(0) reads a counter without a separate existence check; absent reads as round 0.
  return store_->add(key("round"), 0);
}

void ElasticRendezvous::open_next(int64_t round) {
  // Only the first caller for this round moves the counter.
  if (store_->add(round_key(round, "opened_next"), 1) == 1) store_->add(key("round"), 1);
}

void ElasticRendezvous::leave(int64_t round) {
  store_->add(round_key(round, "left"), 1);
}

void ElasticRendezvous::survived(int64_t round) {
  store_->set(round_key(round, detail::str_cat("survived/", options_.node_id)), to_bytes("1"));
}

std::vector<int64_t> ElasticRendezvous::lost_members(const ElasticRound& round,
                                                     std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<int64_t> missing;
  while (true) {
    missing.clear();
    for (const auto& m : round.members) {
      if (m.node_id != options_.node_id &&
          !store_->check({round_key(round.round, detail::str_cat("survived/", m.node_id))}))
        missing.push_back(m.node_id);
    }
    if (missing.empty() || std::chrono::steady_clock::now() >= deadline) return missing;
    std::this_thread::sleep_for(options_.poll);
  }
}

void ElasticRendezvous::mark_finished() {
  store_->set(key("finished"), to_bytes("1"));
}

bool ElasticRendezvous::finished() {
  return store_->check({key("finished")});
}

std::optional<std::vector<ElasticMember>> ElasticRendezvous::members(int64_t round) {
  const std::string k = round_key(round, "members");
  if (!store_->check({k})) return std::nullopt;
  const comm::Bytes b = store_->get(k);
  return decode_members(std::string(b.begin(), b.end()));
}

std::vector<ElasticMember> ElasticRendezvous::close(int64_t round, int64_t joined) {
  std::vector<ElasticMember> joins;
  for (int64_t k = 0; k < joined; ++k) {
    // A join's slot is written right after its counter increment; wait for it briefly.
    const std::string slot = round_key(round, detail::str_cat("slot/", k));
    store_->wait({slot}, options_.join_timeout);
    const comm::Bytes b = store_->get(slot);
    joins.push_back(parse_member(std::string(b.begin(), b.end())));
  }
  // The first MAX arrivals are admitted; later ones wait for the next round.
  if (static_cast<int64_t>(joins.size()) > options_.max_nodes) joins.resize(options_.max_nodes);
  std::sort(joins.begin(), joins.end(),
            [](const ElasticMember& a, const ElasticMember& b) { return a.node_id < b.node_id; });
  const comm::Bytes got =
      store_->compare_set(round_key(round, "members"), {}, to_bytes(encode_members(joins)));
  return decode_members(std::string(got.begin(), got.end()));
}

bool ElasticRendezvous::wait_for_round_after(int64_t round) {
  store_->add(round_key(round, "waiting"), 1);
  MT_LOG_INFO("meshrun", "round ", round, " is already running without this node (",
              options_.node_id, "); waiting for the next round");
  while (open_round() <= round) {
    if (finished()) return false;
    std::this_thread::sleep_for(options_.poll);
  }
  return true;
}

std::optional<ElasticRound> ElasticRendezvous::join() {
  const std::string me =
      member_text({.node_id = options_.node_id, .nproc = options_.nproc, .host = options_.host});
  while (true) {
    if (finished()) return std::nullopt;
    const int64_t round = open_round();
    if (members(round)) {
      if (!wait_for_round_after(round)) return std::nullopt;
      continue;
    }
    const std::string id_key = round_key(round, detail::str_cat("id/", options_.node_id));
    // The claim names this agent instance, so that a second agent with the same id is refused.
    const std::string claim =
        detail::str_cat(me, " pid ", ::getpid(), " at ", reinterpret_cast<uintptr_t>(this));
    const comm::Bytes claimed = store_->compare_set(id_key, {}, to_bytes(claim));
    if (claimed != to_bytes(claim))
      MT_THROW(ValueError, "node id ", options_.node_id, " is already taken by '",
               std::string(claimed.begin(), claimed.end()),
               "'; give every node its own --node-rank");
    const int64_t slot = store_->add(round_key(round, "count"), 1) - 1;
    store_->set(round_key(round, detail::str_cat("slot/", slot)), to_bytes(me));

    // Nodes this round can expect: the previous round's members and those that waited for it,
    // less the members that left for good (read on every look: one may say so late).
    const std::optional<std::vector<ElasticMember>> previous =
        round > 0 ? members(round - 1) : std::nullopt;
    const auto expected_now = [&]() -> int64_t {
      if (!previous) return options_.max_nodes;
      return std::min<int64_t>(options_.max_nodes,
                               static_cast<int64_t>(previous->size()) +
                                   store_->add(round_key(round - 1, "waiting"), 0) -
                                   store_->add(round_key(round - 1, "left"), 0));
    };
    const auto start = std::chrono::steady_clock::now();
    std::optional<std::chrono::steady_clock::time_point> min_reached;
    std::optional<std::vector<ElasticMember>> closed;
    while (!(closed = members(round))) {
      const int64_t expected = expected_now();
      const int64_t joined = store_->add(round_key(round, "count"), 0);
      const auto now = std::chrono::steady_clock::now();
      if (joined >= options_.min_nodes && !min_reached) min_reached = now;
      const bool full = joined >= options_.max_nodes;
      const bool all_expected = joined >= expected && joined >= options_.min_nodes;
      const bool last_call_over = min_reached && now - *min_reached >= options_.last_call;
      if (full || all_expected || last_call_over) {
        closed = close(round, joined);
        break;
      }
      if (!min_reached && now - start >= options_.join_timeout)
        MT_THROW(TimeoutError, "rendezvous round ", round, ": only ", joined, " of at least ",
                 options_.min_nodes, " nodes joined within ",
                 std::chrono::duration_cast<std::chrono::seconds>(options_.join_timeout).count(),
                 " s");
      std::this_thread::sleep_for(options_.poll);
    }
    ElasticRound out;
    out.round = round;
    out.members = *closed;
    bool member = false;
    for (size_t i = 0; i < out.members.size(); ++i) {
      const ElasticMember& m = out.members[i];
      if (m.node_id == options_.node_id) {
        member = true;
        out.group_rank = static_cast<int>(i);
        out.rank_base = out.world_size;
      }
      out.world_size += m.nproc;
    }
    if (member) return out;
    // Joined too late (the round had closed, or was full): the next round admits this node.
    if (!wait_for_round_after(round)) return std::nullopt;
  }
}

bool ElasticRendezvous::nodes_waiting(const ElasticRound& round) {
  if (static_cast<int>(round.members.size()) >= options_.max_nodes) return false;
  return store_->add(round_key(round.round, "waiting"), 0) > 0;
}

}  // namespace meshtrain::runtime
