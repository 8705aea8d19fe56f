#include "meshtrain/parallel/parts/step_runner.h"

#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::parallel {

void StepRunner::check_in_sync(int64_t step, const comm::ProcessGroupPtr& dp) const {
  if (!dp) return;
  // Per-tensor content hashes (device tensors through a host copy).
  const nn::NamedTensors& params = parameters();
  std::vector<uint64_t> mine;
  for (const auto& [name, p] : params) {
    const Tensor host = p.to(Device::cpu());
    mine.push_back(xxh3_64(host.data_ptr(), host.nbytes()));
  }
  const size_t n = mine.size();
  const int world = dp->size();
  std::vector<uint64_t> all(n * static_cast<size_t>(world));
  dp->all_gather(mine.data(), all.data(), n, DType::i64)->wait();
  for (int r = 1; r < world; ++r) {
    for (size_t i = 0; i < n; ++i) {
      if (all[static_cast<size_t>(r) * n + i] != all[i])
        MT_THROW(Error, "step ", step, ": parameters diverged between rank 0 and rank ", r,
                 ", first differing tensor '", params[i].first,
                 "'; data-parallel replicas must stay identical");
    }
  }
}

}  // namespace meshtrain::parallel
