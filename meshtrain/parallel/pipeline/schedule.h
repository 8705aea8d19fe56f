// Pipeline schedules as data. A schedule turns (stages P, this stage p, micro-batches M, virtual
// stages V, kind) into this rank's program: an ordered list of forwards, backwards and batches of
// point-to-point transfers. A runner executes the list; a simulator (schedule_sim.h) runs every
// rank's list together and proves that sends and receives pair up without deadlock. Keeping the
// schedule apart from the runner is what lets it be tested for hundreds of shapes in milliseconds
// and lets a new schedule be added without touching the code that moves tensors.
//
// Vocabulary. The model is cut into S = P * V consecutive pieces, the virtual stages. Rank p holds
// V of them, its chunks: chunk c of rank p is virtual stage c * P + p (Megatron's interleaving;
// with V = 1 chunk 0 is simply stage p). A forward of micro-batch m on virtual stage s needs the
// activation that s - 1 produced for m; a backward needs the gradient that s + 1 produced.
//
// Communication is derived from the compute order, one rule for every kind. The computes come in
// units (one forward or backward; in the interleaved steady state a forward and a backward).
// Before each unit the rank posts the sends of the previous unit's outputs (whose consumers are
// on other ranks) together with the receives of this unit's inputs, as one batch that completes
// when all its transfers have. Posting them together is the fused send+recv that 1F1B needs: two
// neighbours that each sent before receiving would wait on each other forever when sends do not
// buffer. The interleaved schedule needs the larger units: there a rank's send of a gradient can
// wait on a neighbour that is itself sending, unless the receive of the backward that follows
// the next forward was posted already (Megatron posts the same four transfers together).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/plan/schedule_kind.h"

namespace meshtrain::parallel::pipeline {

// The schedule kinds are the planner's (one enum, one parser of parallel.schedule).
using plan::parse_schedule_kind;
using plan::schedule_kind_name;
using plan::ScheduleKind;

struct PipelineShape {
  int stages = 1;          // P: parallel.pp
  int micro_batches = 1;   // M: parallel.micro_batches
  int virtual_stages = 1;  // V: parallel.virtual_stages (chunks per rank)
  ScheduleKind kind = ScheduleKind::one_f_one_b;

  // ValueError naming the config keys when the combination is not a schedule: sizes below 1,
  // V > 1 without interleaving, interleaving with V < 2, or interleaving with M not a multiple
  // of P (Megatron's interleaved schedule walks micro-batches in groups of P).
  void validate() const;
  int num_virtual_stages() const { return stages * virtual_stages; }
  // Chunk c of rank p is virtual stage c * P + p.
  int virtual_stage(int stage, int chunk) const { return chunk * stages + stage; }
  int stage_of(int virtual_stage) const { return virtual_stage % stages; }
  int chunk_of(int virtual_stage) const { return virtual_stage / stages; }
  bool is_first(int stage, int chunk) const { return virtual_stage(stage, chunk) == 0; }
  bool is_last(int stage, int chunk) const {
    return virtual_stage(stage, chunk) == num_virtual_stages() - 1;
  }
};

// One transfer inside a batch. `micro_batch` and `chunk` name the local computation the tensor
// belongs to: for a send, the compute that produced it; for a receive, the one that consumes it.
struct P2POp {
  enum class Kind { send_activation, recv_activation, send_gradient, recv_gradient };
  Kind kind = Kind::send_activation;
  int micro_batch = 0;
  int chunk = 0;
  int peer = 0;      // the other rank (a stage index of the pp group)
  uint32_t tag = 0;  // equal on both ends of one transfer and unique within a step
  bool is_send() const { return kind == Kind::send_activation || kind == Kind::send_gradient; }
};

struct Action {
  enum class Type { forward, backward, p2p };
  Type type = Type::forward;
  int micro_batch = -1;    // forward, backward
  int chunk = -1;          // forward, backward
  std::vector<P2POp> p2p;  // p2p: posted together; the action ends when all have completed
};

// The tag of the transfer that carries (gradient or activation) of micro-batch m into virtual
// stage `to`; both ends compute it from what they know.
uint32_t p2p_tag(const PipelineShape& shape, bool gradient, int micro_batch, int to_virtual_stage);

// The order in which rank `stage` runs its forwards and backwards, without communication, in
// units whose inputs are received together; compute_order is the same flattened.
std::vector<std::vector<Action>> compute_units(const PipelineShape& shape, int stage);
std::vector<Action> compute_order(const PipelineShape& shape, int stage);

// Rank `stage`'s whole program: compute_order with the transfers inserted (see the file comment).
// Validates the shape first.
std::vector<Action> build_schedule(const PipelineShape& shape, int stage);

// "F3.1" (forward, micro-batch 3, chunk 1), "B0.0", "[sa2.0>1 rg1.0<1]" (send activation of
// micro-batch 2 chunk 0 to rank 1 with receive gradient ...), for messages and the docs.
std::string describe(const Action& action);

}  // namespace meshtrain::parallel::pipeline
