#include "meshtrain/plan/layout.h"

#include <sstream>

namespace meshtrain::plan {

std::string Layout::str() const {
  std::ostringstream os;
  os << "dp" << dp << " tp" << tp << " pp" << pp << " z" << zero_stage << " B" << micro_batch << "x"
     << micro_batches;
  if (pp > 1) {
    os << " " << schedule_kind_name(schedule);
    if (virtual_stages > 1) os << "/v" << virtual_stages;
  }
  if (sequence_parallel) os << " sp";
  if (checkpoint_every == 1) os << " ckpt";
  if (checkpoint_every > 1) os << " ckpt/" << checkpoint_every;
  return os.str();
}

MemoryInput memory_input(const TrainSetup& job, const Layout& l, Precision precision) {
  MemoryInput in;
  in.model = job.model;
  in.micro_batch = l.micro_batch;
  in.seq_len = job.seq_len;
  in.precision = precision;
  in.optimizer = job.optimizer;
  in.zero_stage = l.zero_stage;
  in.dp = l.dp;
  in.tp = l.tp;
  in.pp = l.pp;
  in.sequence_parallel = l.sequence_parallel;
  in.schedule = l.schedule;
  in.micro_batches = l.micro_batches;
  in.virtual_stages = l.virtual_stages;
  in.checkpoint_every = l.checkpoint_every;
  in.bucket_bytes = job.bucket_bytes;
  return in;
}

Layout layout_of(const MemoryInput& in) {
  Layout l;
  l.dp = in.dp;
  l.tp = in.tp;
  l.pp = in.pp;
  l.zero_stage = in.zero_stage;
  l.micro_batch = in.micro_batch;
  l.micro_batches = in.micro_batches;
  l.schedule = in.schedule;
  l.virtual_stages = in.virtual_stages;
  l.sequence_parallel = in.sequence_parallel;
  l.checkpoint_every = in.checkpoint_every;
  return l;
}

}  // namespace meshtrain::plan
