#include "meshtrain/runtime/memory_guard.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <sstream>
#include <vector>

#include "meshtrain/plan/layout.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

std::string gib(uint64_t bytes) {
  std::ostringstream os;
  const double b = static_cast<double>(bytes);
  if (b >= 1024.0 * 1048576.0)
    os << std::fixed << std::setprecision(2) << b / (1024.0 * 1048576.0) << " GiB";
  else
    os << std::fixed << std::setprecision(1) << b / 1048576.0 << " MiB";
  return os.str();
}

std::optional<uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  try {
    return std::stoull(text);
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

// This process's cgroup directory for a controller: v2 ("0::/path") or v1 ("N:memory:/path").
std::optional<std::string> cgroup_dir(bool v2) {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1), path = line.substr(b + 1);
    if (v2 && line.rfind("0::", 0) == 0) {
      for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"})
        if (std::ifstream(std::string(root) + path + "/memory.max")) return root + path;
    }
    if (!v2 && controllers == "memory") return "/sys/fs/cgroup/memory" + path;
  }
  return std::nullopt;
}

}  // namespace

plan::ModelShape model_shape(const TrainConfig& c) {
  return {c.model.n_layer,    c.model.n_embd, c.model.n_head,        c.model.vocab_size,
          c.model.block_size, c.model.bias,   c.model.tie_embeddings};
}

plan::MemoryInput memory_input(const ResolvedConfig& r, int world) {
  const TrainConfig& c = r.config;
  plan::MemoryInput in;
  in.model = model_shape(c);
  in.moe = r.moe;
  in.ep = std::max<int64_t>(1, c.parallel.ep);
  in.seq_len = c.model.block_size;
  // Autocast on the CPU keeps f32 weights and activations: the f32 rules apply.
  in.precision = plan::Precision::kF32;
  in.optimizer =
      r.choice.optimizer == OptimizerChoice::sgd
          ? (c.optim.momentum > 0 ? plan::Optimizer::kSgdMomentum : plan::Optimizer::kSgd)
          : plan::Optimizer::kAdamW;
  // The mesh is pp x dp x tp (engine_factory refuses a world that pp x tp does not divide first).
  in.pp = std::max<int64_t>(1, c.parallel.pp);
  in.tp = std::max<int64_t>(1, c.parallel.tp);
  in.dp = std::max<int64_t>(1, world / (in.pp * in.tp));
  in.zero_stage = in.dp > 1 ? static_cast<int>(c.parallel.zero_stage) : 0;
  in.sequence_parallel = in.tp > 1 && c.parallel.sequence_parallel;
  in.micro_batch = c.data.batch_size;
  in.micro_batches = c.train.grad_accum_steps;
  if (in.pp > 1) {
    // A pipeline splits the replica's batch (data.batch_size x train.grad_accum_steps) into
    // parallel.micro_batches (0: one per accumulation step) and runs them under its schedule.
    const int64_t batch = c.data.batch_size * c.train.grad_accum_steps;
    const int64_t m =
        c.parallel.micro_batches > 0 ? c.parallel.micro_batches : c.train.grad_accum_steps;
    in.micro_batches = m;
    in.micro_batch = std::max<int64_t>(1, batch / m);
    in.schedule = r.schedule;
    in.virtual_stages = std::max<int64_t>(1, c.parallel.virtual_stages);
  }
  int64_t checkpointed = 0;
  for (bool b : r.checkpointed_blocks) checkpointed += b ? 1 : 0;
  // The model counts every N-th block; a list is rounded to the nearest such spacing.
  in.checkpoint_every =
      checkpointed == 0 ? 0 : std::max<int64_t>(1, c.model.n_layer / checkpointed);
  in.bucket_bytes = static_cast<int64_t>(c.dist.bucket_mb * 1048576.0);
  return in;
}

std::optional<MemoryLimit> host_memory_limit(int local_ranks) {
  local_ranks = std::max(1, local_ranks);
  std::optional<uint64_t> best;
  std::string source;
  auto consider = [&](uint64_t free, const std::string& what) {
    if (!best || free < *best) {
      best = free;
      source = what;
    }
  };
  if (auto dir = cgroup_dir(true)) {
    if (auto max = read_number(*dir + "/memory.max")) {
      const uint64_t used = read_number(*dir + "/memory.current").value_or(0);
      consider(*max > used ? *max - used : 0,
               "cgroup memory.max " + gib(*max) + " less " + gib(used) + " in use");
    }
  }
  if (auto dir = cgroup_dir(false)) {
    // v1 reports "no limit" as a huge number (a page-rounded LONG_MAX).
    if (auto max = read_number(*dir + "/memory.limit_in_bytes");
        max && *max < (uint64_t{1} << 60)) {
      const uint64_t used = read_number(*dir + "/memory.usage_in_bytes").value_or(0);
      consider(*max > used ? *max - used : 0,
               "cgroup memory.limit_in_bytes " + gib(*max) + " less " + gib(used) + " in use");
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  for (std::string key; meminfo >> key;) {
    uint64_t kib = 0;
    meminfo >> kib;
    meminfo.ignore(64, '\n');
    if (key == "MemAvailable:") consider(kib * 1024, "MemAvailable " + gib(kib * 1024));
  }
  if (!best) return std::nullopt;
  return MemoryLimit{
      *best / static_cast<uint64_t>(local_ranks),
      source +
          (local_ranks > 1 ? " / " + std::to_string(local_ranks) + " ranks on this host" : "")};
}

void check_memory(const ResolvedConfig& r, int world, int local_ranks) {
  const TrainConfig& c = r.config;
  // The memory model (plan/memory_model.h) knows the transformer's tensors; the classifier's
  // are a few KiB to MiB.
  if (!r.memory_check || r.choice.model != ModelKind::gpt) return;
  std::optional<MemoryLimit> limit;
  if (r.memory_limit)
    limit = MemoryLimit{*r.memory_limit, "train.max_memory = " + c.train.max_memory};
  else
    limit = host_memory_limit(local_ranks);
  if (!limit) return;
  const plan::MemoryInput in = memory_input(r, world);
  const plan::MemoryBreakdown est = plan::estimate_memory(in);
  if (static_cast<uint64_t>(est.total()) <= limit->bytes) return;

  // Settings that would fit, each one change away from this run.
  std::vector<std::string> fits;
  auto try_fit = [&](plan::MemoryInput alt, const std::string& change) {
    const int64_t t = plan::estimate_memory(alt).total();
    if (static_cast<uint64_t>(t) <= limit->bytes) fits.push_back(change + " (" + gib(t) + ")");
  };
  // ZeRO is not combined with pipeline or tensor parallelism yet (config.cpp refuses it).
  if (in.dp > 1 && in.pp == 1 && in.tp == 1) {
    for (int stage = in.zero_stage + 1; stage <= 3; ++stage) {
      plan::MemoryInput alt = in;
      alt.zero_stage = stage;
      try_fit(alt, "parallel.zero_stage = " + std::to_string(stage));
    }
  }
  if (in.checkpoint_every != 1) {
    plan::MemoryInput alt = in;
    alt.checkpoint_every = 1;
    try_fit(alt, "model.activation_checkpointing = \"all\"");
  }
  if (in.pp > 1) {
    // Smaller micro-batches: the schedule keeps as many in flight, each holding less.
    const int64_t batch = in.micro_batch * in.micro_batches;
    for (int64_t m = in.micro_batches * 2; m <= batch; m *= 2) {
      if (batch % m != 0) continue;
      plan::MemoryInput alt = in;
      alt.micro_batches = m;
      alt.micro_batch = batch / m;
      try_fit(alt, "parallel.micro_batches = " + std::to_string(m));
      if (!fits.empty() && fits.back().rfind("parallel.micro_batches", 0) == 0) break;
    }
  } else {
    for (int64_t b = in.micro_batch / 2; b >= 1; b /= 2) {
      if (in.micro_batch % b != 0) continue;
      plan::MemoryInput alt = in;
      alt.micro_batch = b;
      const int64_t accum = c.train.grad_accum_steps * (in.micro_batch / b);
      try_fit(alt, "data.batch_size = " + std::to_string(b) +
                       " with train.grad_accum_steps = " + std::to_string(accum));
      if (!fits.empty() && fits.back().rfind("data.batch_size", 0) == 0) break;
    }
  }
  std::ostringstream os;
  os << "memory guard: this run needs about " << gib(static_cast<uint64_t>(est.total()))
     << " per rank (parameters " << gib(static_cast<uint64_t>(est.parameters)) << ", gradients "
     << gib(static_cast<uint64_t>(est.gradients)) << ", optimizer state "
     << gib(static_cast<uint64_t>(est.optimizer_state)) << ", activations "
     << gib(static_cast<uint64_t>(est.activations)) << ", buffers "
     << gib(static_cast<uint64_t>(est.buffers)) << ") with parallel.zero_stage = " << in.zero_stage;
  if (in.pp > 1 || in.tp > 1) os << " (" << plan::layout_of(in).str() << ")";
  os << " on " << world << (world == 1 ? " rank" : " ranks") << ", but a rank may use "
     << gib(limit->bytes) << " (" << limit->source << "); ";
  if (fits.empty()) {
    os << "no single change fits: use more ranks, a smaller model or a larger limit";
  } else {
    os << "settings that fit: ";
    for (size_t i = 0; i < fits.size(); ++i) os << (i ? "; " : "") << fits[i];
  }
  os << " (train.max_memory = off skips this check)";
  MT_THROW(ValueError, os.str());
}

}  // namespace meshtrain::runtime
