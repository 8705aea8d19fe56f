#include "meshtrain/parallel/pipeline/schedule_sim.h"

#include <algorithm>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "meshtrain/util/error.h"

namespace meshtrain::parallel::pipeline {

double SimResult::bubble(int rank) const {
  if (makespan <= 0) return 0.0;
  return 1.0 -
         static_cast<double>(busy.at(static_cast<size_t>(rank))) / static_cast<double>(makespan);
}

namespace {

// What a transfer carries, as both ends describe it.
struct Payload {
  bool gradient = false;
  int micro_batch = 0;
  int to_virtual_stage = 0;
  bool operator==(const Payload&) const = default;
};

// One posted send or receive, waiting to be paired.
struct Posted {
  int64_t time = 0;
  Payload payload;
};

using ChannelKey = std::tuple<int, int, uint32_t>;  // source, destination, tag

struct Channel {
  std::vector<Posted> sends;
  std::vector<Posted> recvs;
};

struct RankState {
  size_t pc = 0;
  int64_t clock = 0;
  bool posted = false;  // the current p2p action's transfers are posted
  // Per transfer of the current p2p action: its channel and its index there.
  std::vector<std::pair<ChannelKey, size_t>> slots;
  std::set<std::pair<int, int>> forwarded, backwarded, received_act, received_grad;
  int alive = 0;
};

std::string op_name(P2POp::Kind k) {
  switch (k) {
    case P2POp::Kind::send_activation:
      return "send activation";
    case P2POp::Kind::recv_activation:
      return "recv activation";
    case P2POp::Kind::send_gradient:
      return "send gradient";
    case P2POp::Kind::recv_gradient:
      return "recv gradient";
  }
  return "?";
}

Payload payload_of(const PipelineShape& s, int rank, const P2POp& op) {
  const int vs = s.virtual_stage(rank, op.chunk);
  switch (op.kind) {
    case P2POp::Kind::send_activation:
      return {false, op.micro_batch, vs + 1};
    case P2POp::Kind::recv_activation:
      return {false, op.micro_batch, vs};
    case P2POp::Kind::send_gradient:
      return {true, op.micro_batch, vs - 1};
    case P2POp::Kind::recv_gradient:
      return {true, op.micro_batch, vs};
  }
  return {};
}

}  // namespace

SimResult simulate(const PipelineShape& s, const std::vector<std::vector<Action>>& programs,
                   const SimOptions& opt) {
  const int P = s.stages;
  MT_CHECK(static_cast<int>(programs.size()) == P, "simulate: ", programs.size(), " programs for ",
           P, " stages");
  SimResult r;
  r.busy.assign(static_cast<size_t>(P), 0);
  r.peak_alive.assign(static_cast<size_t>(P), 0);
  r.spans.resize(static_cast<size_t>(P));
  std::vector<RankState> st(static_cast<size_t>(P));
  std::map<ChannelKey, Channel> channels;
  auto error = [&](int rank, size_t pc, const auto&... what) {
    std::ostringstream os;
    os << "rank " << rank << " action " << pc << " ("
       << describe(programs[static_cast<size_t>(rank)][pc]) << "): ";
    (os << ... << what);
    r.errors.push_back(os.str());
  };

  // Round after round, every rank runs as far as it can; the clocks make the result independent
  // of the order in which ranks are visited.
  bool progress = true;
  while (progress) {
    progress = false;
    for (int p = 0; p < P; ++p) {
      RankState& rs = st[static_cast<size_t>(p)];
      const std::vector<Action>& prog = programs[static_cast<size_t>(p)];
      while (rs.pc < prog.size()) {
        const Action& a = prog[rs.pc];
        if (a.type != Action::Type::p2p) {
          const std::pair<int, int> key{a.micro_batch, a.chunk};
          const bool fwd = a.type == Action::Type::forward;
          if (a.chunk < 0 || a.chunk >= s.virtual_stages || a.micro_batch < 0 ||
              a.micro_batch >= s.micro_batches)
            error(p, rs.pc, "micro-batch or chunk out of range");
          if (fwd) {
            if (rs.forwarded.count(key)) error(p, rs.pc, "forward runs twice");
            if (!s.is_first(p, a.chunk) && !rs.received_act.count(key))
              error(p, rs.pc, "forward runs before its input activation arrived");
            rs.forwarded.insert(key);
            r.peak_alive[static_cast<size_t>(p)] =
                std::max(r.peak_alive[static_cast<size_t>(p)], ++rs.alive);
          } else {
            if (!rs.forwarded.count(key)) error(p, rs.pc, "backward runs before its forward");
            if (rs.backwarded.count(key)) error(p, rs.pc, "backward runs twice");
            if (!s.is_last(p, a.chunk) && !rs.received_grad.count(key))
              error(p, rs.pc, "backward runs before its output gradient arrived");
            rs.backwarded.insert(key);
            --rs.alive;
          }
          const size_t vs = static_cast<size_t>(s.virtual_stage(p, a.chunk));
          const int64_t d =
              fwd ? (opt.forward_times.empty() ? opt.forward_time : opt.forward_times.at(vs))
                  : (opt.backward_times.empty() ? opt.backward_time : opt.backward_times.at(vs));
          r.spans[static_cast<size_t>(p)].push_back({rs.clock, rs.clock + d, a});
          rs.clock += d;
          r.busy[static_cast<size_t>(p)] += d;
          ++rs.pc;
          progress = true;
          continue;
        }
        if (!rs.posted) {
          rs.slots.clear();
          for (const P2POp& op : a.p2p) {
            if (op.peer < 0 || op.peer >= P || op.peer == p) {
              error(p, rs.pc, op_name(op.kind), " names peer ", op.peer);
              continue;
            }
            const std::pair<int, int> key{op.micro_batch, op.chunk};
            if (op.kind == P2POp::Kind::send_activation && !rs.forwarded.count(key))
              error(p, rs.pc, "sends an activation before computing it");
            if (op.kind == P2POp::Kind::send_gradient && !rs.backwarded.count(key))
              error(p, rs.pc, "sends a gradient before computing it");
            const ChannelKey ck =
                op.is_send() ? ChannelKey{p, op.peer, op.tag} : ChannelKey{op.peer, p, op.tag};
            Channel& ch = channels[ck];
            std::vector<Posted>& mine = op.is_send() ? ch.sends : ch.recvs;
            mine.push_back({rs.clock, payload_of(s, p, op)});
            rs.slots.emplace_back(ck, mine.size() - 1);
          }
          rs.posted = true;
          progress = true;
        }
        // Complete when every transfer's other end is posted.
        int64_t done = rs.clock;
        bool all = true;
        for (size_t i = 0; i < rs.slots.size(); ++i) {
          const auto& [ck, idx] = rs.slots[i];
          const Channel& ch = channels[ck];
          const bool send = std::get<0>(ck) == p;
          const std::vector<Posted>& theirs = send ? ch.recvs : ch.sends;
          if (send && opt.buffered_sends) continue;
          if (theirs.size() <= idx) {
            all = false;
            break;
          }
          done = std::max(done, theirs[idx].time);
        }
        if (!all) break;
        // The transfers happened: record what arrived and check both ends agree.
        for (const auto& [ck, idx] : rs.slots) {
          const Channel& ch = channels[ck];
          if (std::get<0>(ck) == p) continue;
          if (idx < ch.sends.size() && !(ch.sends[idx].payload == ch.recvs[idx].payload))
            error(p, rs.pc, "receives something other than what rank ", std::get<0>(ck),
                  " sent under tag ", std::get<2>(ck));
          const Payload& got = ch.recvs[idx].payload;
          const std::pair<int, int> key{got.micro_batch, s.chunk_of(got.to_virtual_stage)};
          (got.gradient ? rs.received_grad : rs.received_act).insert(key);
        }
        rs.clock = done;
        rs.posted = false;
        ++rs.pc;
        progress = true;
      }
    }
  }

  r.completed = true;
  std::ostringstream dl;
  for (int p = 0; p < P; ++p) {
    const RankState& rs = st[static_cast<size_t>(p)];
    r.makespan = std::max(r.makespan, rs.clock);
    const std::vector<Action>& prog = programs[static_cast<size_t>(p)];
    if (rs.pc < prog.size()) {
      r.completed = false;
      dl << (dl.tellp() > 0 ? "; " : "") << "rank " << p << " waits in action " << rs.pc << " "
         << describe(prog[rs.pc]);
    }
  }
  r.deadlock = dl.str();
  for (const auto& [ck, ch] : channels) {
    const auto [src, dst, tag] = ck;
    if (ch.sends.size() != ch.recvs.size()) {
      std::ostringstream os;
      os << ch.sends.size() << " sends from rank " << src << " to rank " << dst << " under tag "
         << tag << " but " << ch.recvs.size() << " receives";
      r.errors.push_back(os.str());
    }
  }
  if (r.completed) {
    for (int p = 0; p < P; ++p) {
      const RankState& rs = st[static_cast<size_t>(p)];
      const size_t want = static_cast<size_t>(s.micro_batches) * s.virtual_stages;
      if (rs.forwarded.size() != want || rs.backwarded.size() != want) {
        std::ostringstream os;
        os << "rank " << p << " ran " << rs.forwarded.size() << " forwards and "
           << rs.backwarded.size() << " backwards, not " << want << " of each";
        r.errors.push_back(os.str());
      }
    }
  }
  return r;
}

SimResult simulate(const PipelineShape& shape, const SimOptions& options) {
  std::vector<std::vector<Action>> programs;
  for (int p = 0; p < shape.stages; ++p) programs.push_back(build_schedule(shape, p));
  return simulate(shape, programs, options);
}

std::string render_timeline(const SimResult& result) {
  std::ostringstream os;
  for (size_t p = 0; p < result.spans.size(); ++p) {
    std::string line(static_cast<size_t>(result.makespan), '.');
    for (const SimSpan& sp : result.spans[p]) {
      const int m = sp.action.micro_batch;
      const char c = sp.action.type == Action::Type::forward ? static_cast<char>('0' + m % 10)
                                                             : static_cast<char>('a' + m % 26);
      for (int64_t t = sp.begin; t < sp.end; ++t) line[static_cast<size_t>(t)] = c;
    }
    os << "stage " << p << " |" << line << "|\n";
  }
  return os.str();
}

}  // namespace meshtrain::parallel::pipeline
