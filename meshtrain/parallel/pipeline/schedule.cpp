#include "meshtrain/parallel/pipeline/schedule.h"

#include <algorithm>
#include <optional>
#include <sstream>

#include "meshtrain/util/error.h"

namespace meshtrain::parallel::pipeline {

void PipelineShape::validate() const {
  if (stages < 1) MT_THROW(ValueError, "parallel.pp must be at least 1, got ", stages);
  if (micro_batches < 1)
    MT_THROW(ValueError, "parallel.micro_batches must be at least 1, got ", micro_batches);
  if (virtual_stages < 1)
    MT_THROW(ValueError, "parallel.virtual_stages must be at least 1, got ", virtual_stages);
  // Tags pack (virtual stage, micro-batch, direction) into 31 bits.
  if (static_cast<int64_t>(stages) * virtual_stages * micro_batches > (int64_t{1} << 29))
    MT_THROW(ValueError, "parallel.pp (", stages, ") x parallel.virtual_stages (", virtual_stages,
             ") x parallel.micro_batches (", micro_batches, ") is too large for one step");
  if (kind != ScheduleKind::interleaved) {
    if (virtual_stages != 1)
      MT_THROW(ValueError, "parallel.virtual_stages = ", virtual_stages,
               " needs parallel.schedule = interleaved (", schedule_kind_name(kind),
               " runs one chunk per stage); set parallel.virtual_stages = 1 or choose interleaved");
    return;
  }
  if (virtual_stages < 2)
    MT_THROW(ValueError,
             "parallel.schedule = interleaved needs parallel.virtual_stages >= 2 (with 1 chunk per "
             "stage it is 1f1b); raise parallel.virtual_stages or use parallel.schedule = 1f1b");
  if (stages < 2)
    MT_THROW(ValueError,
             "parallel.schedule = interleaved needs parallel.pp >= 2 (one stage has no neighbour "
             "to interleave with); use parallel.schedule = 1f1b or raise parallel.pp");
  if (micro_batches % stages != 0)
    MT_THROW(ValueError, "parallel.schedule = interleaved needs parallel.micro_batches (",
             micro_batches, ") to be a multiple of parallel.pp (", stages,
             "), as Megatron's interleaved schedule walks micro-batches in groups of pp; use ",
             std::max(stages, micro_batches / stages * stages), " or ",
             (micro_batches / stages + 1) * stages, " micro-batches");
}

uint32_t p2p_tag(const PipelineShape& shape, bool gradient, int micro_batch, int to_virtual_stage) {
  MT_CHECK(micro_batch >= 0 && micro_batch < shape.micro_batches, "micro-batch ", micro_batch,
           " out of range");
  MT_CHECK(to_virtual_stage >= 0 && to_virtual_stage < shape.num_virtual_stages(), "virtual stage ",
           to_virtual_stage, " out of range");
  const uint64_t key =
      (static_cast<uint64_t>(to_virtual_stage) * static_cast<uint64_t>(shape.micro_batches) +
       static_cast<uint64_t>(micro_batch))
          << 1 |
      (gradient ? 1u : 0u);
  return static_cast<uint32_t>(key);
}

namespace {

Action compute(Action::Type type, int micro_batch, int chunk) {
  Action a;
  a.type = type;
  a.micro_batch = micro_batch;
  a.chunk = chunk;
  return a;
}

// Interleaved slot k (the k-th forward or backward of this rank) -> (micro-batch, chunk).
// Micro-batches go through the chunks in groups of P: chunk 0 for micro-batches 0..P-1, chunk 1
// for the same, ..., then chunk 0 for P..2P-1. Backwards visit the chunks in reverse.
std::pair<int, int> interleaved_slot(const PipelineShape& s, int k, bool forward) {
  const int group_size = s.stages * s.virtual_stages;
  const int group = k / group_size;
  const int within = k % group_size;
  int chunk = within / s.stages;
  if (!forward) chunk = s.virtual_stages - 1 - chunk;
  return {group * s.stages + within % s.stages, chunk};
}

// The transfer that brings a compute's input, if its producer is another virtual stage.
std::optional<P2POp> input_recv(const PipelineShape& s, int stage, const Action& a) {
  const int vs = s.virtual_stage(stage, a.chunk);
  P2POp op;
  op.micro_batch = a.micro_batch;
  op.chunk = a.chunk;
  if (a.type == Action::Type::forward) {
    if (vs == 0) return std::nullopt;  // reads the batch
    op.kind = P2POp::Kind::recv_activation;
    op.peer = s.stage_of(vs - 1);
    op.tag = p2p_tag(s, false, a.micro_batch, vs);
  } else {
    if (vs == s.num_virtual_stages() - 1) return std::nullopt;  // starts from the loss
    op.kind = P2POp::Kind::recv_gradient;
    op.peer = s.stage_of(vs + 1);
    op.tag = p2p_tag(s, true, a.micro_batch, vs);
  }
  return op;
}

// The transfer that carries a compute's output on, if its consumer is another virtual stage.
std::optional<P2POp> output_send(const PipelineShape& s, int stage, const Action& a) {
  const int vs = s.virtual_stage(stage, a.chunk);
  P2POp op;
  op.micro_batch = a.micro_batch;
  op.chunk = a.chunk;
  if (a.type == Action::Type::forward) {
    if (vs == s.num_virtual_stages() - 1) return std::nullopt;  // the loss stays here
    op.kind = P2POp::Kind::send_activation;
    op.peer = s.stage_of(vs + 1);
    op.tag = p2p_tag(s, false, a.micro_batch, vs + 1);
  } else {
    if (vs == 0) return std::nullopt;  // the embedding's input has no gradient
    op.kind = P2POp::Kind::send_gradient;
    op.peer = s.stage_of(vs - 1);
    op.tag = p2p_tag(s, true, a.micro_batch, vs - 1);
  }
  return op;
}

}  // namespace

std::vector<std::vector<Action>> compute_units(const PipelineShape& s, int stage) {
  s.validate();
  MT_CHECK(stage >= 0 && stage < s.stages, "stage ", stage, " is not one of ", s.stages);
  const int P = s.stages, M = s.micro_batches, V = s.virtual_stages;
  std::vector<std::vector<Action>> out;
  using T = Action::Type;
  switch (s.kind) {
    case ScheduleKind::gpipe:
      for (int m = 0; m < M; ++m) out.push_back({compute(T::forward, m, 0)});
      for (int m = 0; m < M; ++m) out.push_back({compute(T::backward, m, 0)});
      break;
    case ScheduleKind::one_f_one_b: {
      // Stage p runs P - p - 1 forwards ahead, so the last stage can start its first backward
      // as soon as the first micro-batch reaches it; then each forward is followed by the oldest
      // outstanding backward, which bounds the activations alive on stage p by P - p.
      const int warmup = std::min(P - stage - 1, M);
      for (int m = 0; m < warmup; ++m) out.push_back({compute(T::forward, m, 0)});
      for (int i = 0; i < M - warmup; ++i) {
        out.push_back({compute(T::forward, warmup + i, 0)});
        out.push_back({compute(T::backward, i, 0)});
      }
      for (int m = M - warmup; m < M; ++m) out.push_back({compute(T::backward, m, 0)});
      break;
    }
    case ScheduleKind::interleaved: {
      // Megatron's warm-up: enough forwards that, when the first backward of the last chunk
      // comes back, every later forward has its input (two per downstream stage, since each
      // round trip crosses it twice, plus the P forwards of every chunk but the last).
      const int total = M * V;
      const int warmup = std::min((P - stage - 1) * 2 + (V - 1) * P, total);
      for (int k = 0; k < warmup; ++k) {
        auto [m, c] = interleaved_slot(s, k, true);
        out.push_back({compute(T::forward, m, c)});
      }
      for (int i = 0; i < total - warmup; ++i) {
        auto [fm, fc] = interleaved_slot(s, warmup + i, true);
        auto [bm, bc] = interleaved_slot(s, i, false);
        // One unit: the backward's gradient is received together with the forward's input.
        out.push_back({compute(T::forward, fm, fc), compute(T::backward, bm, bc)});
      }
      for (int k = total - warmup; k < total; ++k) {
        auto [m, c] = interleaved_slot(s, k, false);
        out.push_back({compute(T::backward, m, c)});
      }
      break;
    }
  }
  return out;
}

std::vector<Action> compute_order(const PipelineShape& s, int stage) {
  std::vector<Action> out;
  for (std::vector<Action>& unit : compute_units(s, stage))
    for (Action& a : unit) out.push_back(std::move(a));
  return out;
}

std::vector<Action> build_schedule(const PipelineShape& s, int stage) {
  std::vector<Action> out;
  std::vector<P2POp> pending;  // the previous unit's sends
  auto flush = [&](std::vector<P2POp> ops) {
    if (ops.empty()) return;
    Action batch;
    batch.type = Action::Type::p2p;
    batch.p2p = std::move(ops);
    out.push_back(std::move(batch));
  };
  for (std::vector<Action>& unit : compute_units(s, stage)) {
    std::vector<P2POp> ops = std::move(pending);
    pending.clear();
    for (const Action& a : unit) {
      if (auto recv = input_recv(s, stage, a)) ops.push_back(*recv);
      if (auto send = output_send(s, stage, a)) pending.push_back(*send);
    }
    flush(std::move(ops));
    for (Action& a : unit) out.push_back(std::move(a));
  }
  flush(std::move(pending));
  return out;
}

std::string describe(const Action& a) {
  std::ostringstream os;
  switch (a.type) {
    case Action::Type::forward:
      os << 'F' << a.micro_batch << '.' << a.chunk;
      break;
    case Action::Type::backward:
      os << 'B' << a.micro_batch << '.' << a.chunk;
      break;
    case Action::Type::p2p: {
      os << '[';
      for (size_t i = 0; i < a.p2p.size(); ++i) {
        const P2POp& op = a.p2p[i];
        static constexpr const char* kNames[] = {"sa", "ra", "sg", "rg"};
        os << (i ? " " : "") << kNames[static_cast<int>(op.kind)] << op.micro_batch << '.'
           << op.chunk << (op.is_send() ? '>' : '<') << op.peer;
      }
      os << ']';
      break;
    }
  }
  return os.str();
}

}  // namespace meshtrain::parallel::pipeline
