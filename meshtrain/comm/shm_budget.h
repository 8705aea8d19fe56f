// The host-wide budget that the shm groups of one job share: the /dev/shm their segments may take
// together, how it is divided among the groups, and how many of the job's ranks share the cores.
// A job makes several groups at once (a DeviceMesh splits pp, dp and tp groups off the world, each
// rank in several of them): were each group to size its segment from what /dev/shm has free, the
// first would take half of it, the next half of the rest, and the last would be squeezed to its
// smallest or fail; were each group's waiters to spin as if its ranks had the cores to
// themselves, eight ranks on two cores would spin against each other.
//
// The first group of the job (the world) fixes the budget: its rank 0 takes half of what /dev/shm
// has free (the other half is for buffers from allocate_buffer) and publishes it with the
// segment's description, so every rank holds the same numbers. The groups that will be split off
// it are declared when it is made (ProcessGroupOptions::shm_budget.planned_groups, from
// DeviceMesh::split_sizes); every group's segment is then sized from its share, weighted by its
// rank count. Splits are made in the same order on every rank, so every rank walks the plan alike
// and no group needs a collective of its own to learn its share. A split the plan does not list
// sizes itself from what is free, as a group alone does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace meshtrain::comm {

struct ShmBudget {
  // Given by the caller on the group made first: the rank counts of the groups that will be split
  // off it on this host, in the order they will be made (every split, including those of which a
  // rank is no member). Empty: the group sizes itself alone.
  std::vector<int> planned_groups;
  // Filled in by the shm group and passed on to its planned splits: what the job's segments may
  // take together (0: no budget, the group sizes itself from what /dev/shm has free)...
  uint64_t job_bytes = 0;
  // ... of which this group's segment takes weight / total_weight (its rank count over the rank
  // counts of every group sharing job_bytes).
  int weight = 0;
  int total_weight = 0;
  // The job's ranks on this host and the cores they may use together (their affinity masks,
  // joined); 0: unknown, the group judges from its own ranks and cores.
  int host_ranks = 0;
  int host_cpus = 0;

  // This group's part of job_bytes; 0 without a budget.
  uint64_t share_bytes() const;
};

// The budget of the job's first group of `ranks` ranks: half of `dev_shm_free` for the segments,
// shared by it and the planned groups.
ShmBudget root_shm_budget(const ShmBudget& given, uint64_t dev_shm_free, int ranks);

// The budget of the `index`-th split (0-based, counting every split made off this group) of
// `members` ranks: a share of the parent's job_bytes where the plan lists a group of that size
// at that place, else none (it sizes itself alone). The host's ranks and cores pass on either way.
ShmBudget split_shm_budget(const ShmBudget& parent, size_t index, int members);

// The ranks and cores a group's waiters judge spinning by: the host's when they are more ranks
// per core than the group's own (the group's ranks compete with the job's other groups' ranks),
// else the group's.
struct ShmCoreShare {
  int ranks = 1;
  int cpus = 1;
};
ShmCoreShare shm_core_share(int group_ranks, int group_cpus, const ShmBudget& budget);

// Staging-buffer and channel sizes of one rank of a segment, and the segment's size for them.
struct ShmSegmentFit {
  size_t chunk_bytes = 0;
  size_t channel_bytes = 0;
  size_t segment_bytes = 0;
};
// Halves the staging buffers, then the channels, until the segment (`bytes_for(chunk, channel)`)
// takes at most `target` bytes or both are at their smallest (`min_chunk`, `min_channel`).
ShmSegmentFit fit_shm_segment(size_t chunk_bytes, size_t channel_bytes, size_t min_chunk,
                              size_t min_channel, uint64_t target,
                              const std::function<size_t(size_t, size_t)>& bytes_for);

}  // namespace meshtrain::comm
