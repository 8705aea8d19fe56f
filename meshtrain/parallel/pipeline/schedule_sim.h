// Runs every rank's pipeline program together on a model clock, without tensors, to prove a
// schedule sound before any runner executes it, and to measure its bubble.
//
// The model: a forward of one chunk takes `forward_time`, a backward `backward_time` (or each
// virtual stage its own), transfers
// take no time. A p2p action posts all its transfers at once and ends when every one has
// completed. Transfers pair by (source, destination, tag), in issue order per tag, as the
// process groups' send and recv do. A receive completes when its send has been posted. A send
// completes when its receive has been posted (rendezvous: the strictest transport, under which a
// schedule that works also works on any buffering one) or, with buffered sends, at once.
//
// Checked, each violation a line in `errors`: every send has its receive and the reverse; both
// ends of a transfer agree on what it carries (activation or gradient, micro-batch, the virtual
// stage it enters); a forward on a virtual stage other than the first has received its input
// before it runs and a backward on one other than the last has received its output gradient;
// a send carries a result already computed; every (micro-batch, chunk) of every rank runs its
// forward once and then its backward once. A program that cannot go on names the blocked ranks
// and what each waits for in `deadlock`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/parallel/pipeline/schedule.h"

namespace meshtrain::parallel::pipeline {

struct SimOptions {
  bool buffered_sends = false;  // false: rendezvous
  int64_t forward_time = 1;     // per chunk
  int64_t backward_time = 2;    // per chunk
  // When not empty: per virtual stage (one entry each), instead of the two above, for stages of
  // unequal cost (a partition's predicted times).
  std::vector<int64_t> forward_times;
  std::vector<int64_t> backward_times;
};

struct SimSpan {
  int64_t begin = 0;
  int64_t end = 0;
  Action action;  // forward or backward
};

struct SimResult {
  bool completed = false;           // every rank ran its whole program
  std::string deadlock;             // when not completed: who waits for what
  std::vector<std::string> errors;  // pairing, ordering and dependency violations
  int64_t makespan = 0;             // the clock when the last rank finished
  std::vector<int64_t> busy;        // per rank: time spent computing
  std::vector<int> peak_alive;      // per rank: most (micro-batch, chunk) activations held at once
  std::vector<std::vector<SimSpan>> spans;  // per rank, in order

  bool sound() const { return completed && errors.empty(); }
  // The idle share of the step on `rank`: 1 - busy / makespan.
  double bubble(int rank) const;
};

// programs[p] is rank p's program (build_schedule(shape, p)).
SimResult simulate(const PipelineShape& shape, const std::vector<std::vector<Action>>& programs,
                   const SimOptions& options = {});

// Every rank's program for `shape`, simulated.
SimResult simulate(const PipelineShape& shape, const SimOptions& options = {});

// One line per rank, one character per clock tick: the micro-batch number (mod 10) of a forward,
// a letter for a backward (a = micro-batch 0, ...), '.' idle. For the docs and failure messages.
std::string render_timeline(const SimResult& result);

}  // namespace meshtrain::parallel::pipeline
