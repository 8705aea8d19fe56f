// HierProcessGroup: sub-groups from the host layout, the two-level all-reduce, and errors that
// name global ranks.
#include "meshtrain/comm/process_group_hier.h"

#include <algorithm>
#include <cctype>
#include <numeric>

#include "meshtrain/comm/process_group_shm.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

// Rewrites every "ranks [a, b]" of a sub-group's message into the global ranks of its members.
// Messages relayed from an abort already speak of global ranks and are left alone.
std::string translate_ranks(const std::string& msg, const std::vector<int>& members) {
  if (msg.find("aborted the group") != std::string::npos) return msg;
  static constexpr std::string_view kMark = "ranks [";
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t at = msg.find(kMark, pos);
    if (at == std::string::npos) break;
    size_t close = msg.find(']', at);
    if (close == std::string::npos) break;
    out.append(msg, pos, at + kMark.size() - pos);
    std::string list = msg.substr(at + kMark.size(), close - at - kMark.size());
    bool first = true;
    size_t i = 0;
    bool ok = true;
    std::string mapped;
    while (i < list.size() && ok) {
      while (i < list.size() && (list[i] == ' ' || list[i] == ',')) ++i;
      size_t j = i;
      while (j < list.size() && std::isdigit(static_cast<unsigned char>(list[j]))) ++j;
      if (j == i) {
        ok = i >= list.size();
        break;
      }
      size_t idx = std::stoul(list.substr(i, j - i));
      ok = idx < members.size();
      if (ok) mapped += (first ? "" : ", ") + std::to_string(members[idx]);
      first = false;
      i = j;
    }
    out += ok ? mapped : list;
    out += ']';
    pos = close + 1;
  }
  out.append(msg, pos, std::string::npos);
  return out;
}

ProcessGroupOptions sub_options(const ProcessGroupOptions& opts, const std::string& suffix) {
  ProcessGroupOptions o = opts;
  o.name = opts.name + "/hier-" + suffix;
  // The plan counts the job's groups, not one host's: a host's group sizes itself alone.
  o.shm_budget = ShmBudget{};
  return o;
}

}  // namespace

HierProcessGroup::HierProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                   ProcessGroupOptions opts)
    : ProcessGroupBase(std::move(store), rank, size, std::move(opts), "hier") {
  layout_ = exchange_host_layout(*this->store(), key_prefix() + "hier/host/", rank, size,
                                 local_host_id(options()));
  const int host = layout_.host_index[rank];
  const int local_rank = layout_.local_rank[rank];
  const auto& mine = layout_.hosts[host];
  // Every rank builds its sub-groups in the same order (local, cross, flat): the shm group meets
  // its members while it is constructed, so the order must not depend on the rank.
  if (mine.size() > 1) {
    local_.members = mine;
    local_.stage = "within-host (shm)";
    local_.group =
        std::make_shared<ShmProcessGroup>(this->store(), local_rank, static_cast<int>(mine.size()),
                                          sub_options(options(), "local" + std::to_string(host)));
  }
  if (layout_.num_hosts() > 1 && (layout_.uniform() || local_rank == 0)) {
    for (const auto& h : layout_.hosts) cross_.members.push_back(h[local_rank]);
    cross_.stage = "across hosts (tcp)";
    const int cross_rank = host;
    cross_.group = std::make_shared<TcpProcessGroup>(
        this->store(), cross_rank, static_cast<int>(cross_.members.size()),
        sub_options(options(), "cross" + std::to_string(local_rank)));
  }
  auto flat =
      std::make_shared<TcpProcessGroup>(this->store(), rank, size, sub_options(options(), "flat"));
  flat_tcp_ = flat.get();
  flat_.group = std::move(flat);
  flat_.members.resize(size);
  std::iota(flat_.members.begin(), flat_.members.end(), 0);
  flat_.stage = "all ranks (tcp)";
  start();
}

ProcessGroupPtr HierProcessGroup::split(const std::vector<int>& ranks) {
  // Decided from the layout alone, which every rank holds, so all members pick the same backend.
  bool one_host = !ranks.empty();
  for (int r : ranks)
    one_host = one_host && r >= 0 && r < size() &&
               layout_.host_index[static_cast<size_t>(r)] ==
                   layout_.host_index[static_cast<size_t>(ranks.front())];
  return split_with_backend(ranks, one_host ? "shm" : "hier");
}

HierProcessGroup::~HierProcessGroup() {
  stop();
}

void HierProcessGroup::on_abort(const std::string& reason) {
  for (const Sub* s : {&local_, &cross_, &flat_}) {
    if (s->group) s->group->abort(reason);
  }
}

std::string HierProcessGroup::algorithm_label(const OpContext& ctx) const {
  return "hier/" + std::string(algorithm_name(ctx.algorithm));
}

Duration HierProcessGroup::left(const OpContext& ctx, bool cross) const {
  auto remaining =
      std::chrono::duration_cast<Duration>(ctx.deadline - std::chrono::steady_clock::now());
  if (cross) {
    remaining -= std::min<Duration>(std::chrono::duration_cast<Duration>(ctx.timeout / 5),
                                    std::chrono::seconds(1));
  }
  return std::max<Duration>(remaining, Duration(1));
}

template <typename Fn>
void HierProcessGroup::step(const Sub& sub, Fn fn) {
  try {
    fn(*sub.group);
  } catch (const CommError& e) {
    throw_if_aborted();
    MT_THROW(CommError, sub.stage, " step: ", translate_ranks(e.what(), sub.members));
  }
}

bool HierProcessGroup::sharded(size_t bytes) const {
  if (!local_.group || !cross_.group || !layout_.uniform()) return false;
  return bytes >= kShardedMinBytes;
}

void HierProcessGroup::all_reduce_via_leaders(const OpContext& ctx, void* data, size_t count,
                                              DType dtype, ReduceOp op) {
  if (local_.group) {
    step(local_, [&](ProcessGroup& g) {
      g.reduce(data, count, dtype, {.root = 0, .op = op, .timeout = left(ctx, false)})->wait();
    });
  }
  if (cross_.group && layout_.local_rank[rank()] == 0) {
    step(cross_, [&](ProcessGroup& g) {
      g.all_reduce(data, count, dtype,
                   {.op = op, .timeout = left(ctx, true), .algorithm = ctx.algorithm})
          ->wait();
    });
  }
  if (local_.group) {
    step(local_, [&](ProcessGroup& g) {
      g.broadcast(data, count, dtype, {.root = 0, .timeout = left(ctx, false)})->wait();
    });
  }
}

void HierProcessGroup::all_reduce_sharded(const OpContext& ctx, void* data, size_t count,
                                          DType dtype, ReduceOp op) {
  const size_t local_size = local_.members.size();
  const size_t es = dtype_size(dtype);
  const size_t shard = count / local_size;
  std::vector<uint8_t> piece(shard * es);
  step(local_, [&](ProcessGroup& g) {
    g.reduce_scatter(data, piece.data(), shard, dtype, {.op = op, .timeout = left(ctx, false)})
        ->wait();
  });
  step(cross_, [&](ProcessGroup& g) {
    g.all_reduce(piece.data(), shard, dtype,
                 {.op = op, .timeout = left(ctx, true), .algorithm = ctx.algorithm})
        ->wait();
  });
  step(local_, [&](ProcessGroup& g) {
    g.all_gather(piece.data(), data, shard, dtype, {.timeout = left(ctx, false)})->wait();
  });
  if (size_t done = shard * local_size; done < count) {
    all_reduce_via_leaders(ctx, static_cast<uint8_t*>(data) + done * es, count - done, dtype, op);
  }
}

void HierProcessGroup::run_all_reduce(OpContext& ctx, void* data, size_t count, DType dtype,
                                      ReduceOp op) {
  if (size() == 1 || count == 0) return;
  const DType acc = accumulation_dtype(dtype);
  std::vector<uint8_t> wide;
  void* buf = data;
  if (acc != dtype) {
    wide.resize(count * dtype_size(acc));
    convert(data, dtype, wide.data(), acc, count);
    buf = wide.data();
  }
  const ReduceOp wire = op == ReduceOp::avg ? ReduceOp::sum : op;
  if (sharded(count * dtype_size(acc))) {
    all_reduce_sharded(ctx, buf, count, acc, wire);
  } else {
    all_reduce_via_leaders(ctx, buf, count, acc, wire);
  }
  if (op == ReduceOp::avg) divide_by(buf, count, acc, size());
  if (acc != dtype) convert(buf, acc, data, dtype, count);
}

void HierProcessGroup::run_broadcast(OpContext& ctx, void* data, size_t count, DType dtype,
                                     int root) {
  step(flat_, [&](ProcessGroup& g) {
    g.broadcast(data, count, dtype,
                {.root = root, .timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_reduce(OpContext& ctx, void* data, size_t count, DType dtype,
                                  ReduceOp op, int root) {
  step(flat_, [&](ProcessGroup& g) {
    g.reduce(data, count, dtype,
             {.root = root, .op = op, .timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_all_gather_v(OpContext& ctx, const void* input, void* output,
                                        const std::vector<size_t>& counts, DType dtype) {
  step(flat_, [&](ProcessGroup& g) {
    g.all_gather_v(input, output, counts, dtype,
                   {.timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_reduce_scatter(OpContext& ctx, const void* input, void* output,
                                          size_t count, DType dtype, ReduceOp op) {
  step(flat_, [&](ProcessGroup& g) {
    g.reduce_scatter(input, output, count, dtype,
                     {.op = op, .timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_gather(OpContext& ctx, const void* input, void* output, size_t count,
                                  DType dtype, int root) {
  step(flat_, [&](ProcessGroup& g) {
    g.gather(input, output, count, dtype,
             {.root = root, .timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                                   DType dtype, int root) {
  step(flat_, [&](ProcessGroup& g) {
    g.scatter(input, output, count, dtype,
              {.root = root, .timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_all_to_all(OpContext& ctx, const void* input, void* output, size_t count,
                                      DType dtype) {
  step(flat_, [&](ProcessGroup& g) {
    g.all_to_all(input, output, count, dtype,
                 {.timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_all_to_all_v(OpContext& ctx, const void* input,
                                        const std::vector<size_t>& send_counts, void* output,
                                        const std::vector<size_t>& recv_counts, DType dtype) {
  // Pairwise over the flat tcp group, as all_to_all: each block has one destination, so there is
  // nothing to combine within a host on the way.
  step(flat_, [&](ProcessGroup& g) {
    g.all_to_all_v(input, send_counts, output, recv_counts, dtype,
                   {.timeout = left(ctx, false), .algorithm = ctx.algorithm})
        ->wait();
  });
}

void HierProcessGroup::run_barrier(OpContext& ctx) {
  step(flat_, [&](ProcessGroup& g) { g.barrier({.timeout = left(ctx, false)})->wait(); });
}

}  // namespace meshtrain::comm
