#include "meshtrain/comm/shm_budget.h"

#include <algorithm>
#include <numeric>

namespace meshtrain::comm {

uint64_t ShmBudget::share_bytes() const {
  if (job_bytes == 0 || weight <= 0 || total_weight <= 0) return 0;
  // 128-bit: job_bytes * weight can pass 2^64 for a large /dev/shm and many ranks.
  const auto share = static_cast<unsigned __int128>(job_bytes) * static_cast<unsigned>(weight) /
                     static_cast<unsigned>(total_weight);
  return static_cast<uint64_t>(share);
}

ShmBudget root_shm_budget(const ShmBudget& given, uint64_t dev_shm_free, int ranks) {
  ShmBudget b = given;
  b.job_bytes = dev_shm_free / 2;
  b.weight = ranks;
  b.total_weight = std::accumulate(given.planned_groups.begin(), given.planned_groups.end(), ranks);
  if (b.host_ranks <= 0) b.host_ranks = ranks;
  return b;
}

ShmBudget split_shm_budget(const ShmBudget& parent, size_t index, int members) {
  ShmBudget b;
  b.host_ranks = parent.host_ranks;
  b.host_cpus = parent.host_cpus;
  if (parent.job_bytes > 0 && index < parent.planned_groups.size() &&
      parent.planned_groups[index] == members) {
    b.job_bytes = parent.job_bytes;
    b.weight = members;
    b.total_weight = parent.total_weight;
  }
  return b;
}

ShmCoreShare shm_core_share(int group_ranks, int group_cpus, const ShmBudget& budget) {
  ShmCoreShare own{std::max(1, group_ranks), std::max(1, group_cpus)};
  if (budget.host_ranks <= 0 || budget.host_cpus <= 0) return own;
  const ShmCoreShare host{budget.host_ranks, budget.host_cpus};
  // host.ranks / host.cpus > own.ranks / own.cpus, without division.
  const bool host_busier = int64_t{host.ranks} * own.cpus > int64_t{own.ranks} * host.cpus;
  return host_busier ? host : own;
}

ShmSegmentFit fit_shm_segment(size_t chunk_bytes, size_t channel_bytes, size_t min_chunk,
                              size_t min_channel, uint64_t target,
                              const std::function<size_t(size_t, size_t)>& bytes_for) {
  constexpr size_t kLine = 64;
  ShmSegmentFit f{chunk_bytes, channel_bytes, bytes_for(chunk_bytes, channel_bytes)};
  while (f.segment_bytes > target) {
    if (f.chunk_bytes > min_chunk) {
      f.chunk_bytes = std::max(min_chunk, (f.chunk_bytes / 2 + kLine - 1) / kLine * kLine);
    } else if (f.channel_bytes > min_channel) {
      f.channel_bytes = std::max(min_channel, f.channel_bytes / 2);
    } else {
      break;
    }
    f.segment_bytes = bytes_for(f.chunk_bytes, f.channel_bytes);
  }
  return f;
}

}  // namespace meshtrain::comm
