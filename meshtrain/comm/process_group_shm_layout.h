// The shared segment of a ShmProcessGroup: the header, one block per rank, the in-place slots,
// and the constants that size them. Private to the process_group_shm*.cpp files (each one
// concept of the group), which all read and write this one layout.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshtrain/comm/process_group_shm.h"

namespace meshtrain::comm {
namespace shm_internal {

constexpr uint64_t kMagic = 0x6d7473686d763033ull;  // "mtshmv03"
constexpr size_t kLine = 64;
constexpr int kCpuWords = 16;  // cores 0-1023 in a rank's published affinity
// In-place all-reduces in flight at once (issued by some rank, not yet finished by every rank).
// A rank that issues more before the oldest is done announces the newer ones when they run.
constexpr uint64_t kSlots = 64;

inline size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

}  // namespace shm_internal

struct ShmProcessGroup::Header {
  std::atomic<uint64_t> magic;
  uint32_t size;
  uint32_t pad0;
  uint64_t chunk_bytes;
  uint64_t channel_bytes;
  std::atomic<uint32_t> aborted;
  int32_t abort_rank;
  char abort_reason[400];
  alignas(shm_internal::kLine) std::atomic<uint64_t> arrivals;  // barrier arrivals, all ranks, ever
  alignas(shm_internal::kLine) std::atomic<uint32_t> epoch;  // last completed barrier (futex word)
  std::atomic<uint32_t> mapped;
  alignas(shm_internal::kLine)
      std::atomic<uint32_t> sleepers;  // ranks asleep on a futex: wake only if any
  alignas(shm_internal::kLine)
      std::atomic<uint32_t> signal;  // bumped when an in-place slot changes (futex)
};

struct alignas(shm_internal::kLine) ShmProcessGroup::RankBlock {
  uint64_t cpus[shm_internal::kCpuWords];  // the cores this rank may run on (its affinity), set
                                           // before the first barrier
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> arrived;   // last barrier this rank arrived at (low 32 bits)
  std::atomic<uint64_t> seq;       // the operation it runs (+1; 0 = none yet)
  std::atomic<uint32_t> doorbell;  // rung by peers that touched a ring shared with this rank
};

// One in-place all-reduce in flight: ticket t uses slot t % kSlots in its round t / kSlots. The
// last rank to leave resets the slot and opens it for the next round.
struct alignas(shm_internal::kLine) ShmProcessGroup::Slot {
  std::atomic<uint64_t> open_round;  // the round that may use the slot now
  std::atomic<uint32_t> arrivals;
  std::atomic<uint32_t> verdict;  // 0: not all arrived; 1: in place; 2: staged
  std::atomic<uint32_t> left;
  alignas(shm_internal::kLine) std::atomic<uint32_t> next_chunk;  // claims
  alignas(shm_internal::kLine) std::atomic<uint32_t> chunks_done;
};

// What a rank announced for the slot's operation (followed by the next rank's, one line each).
struct alignas(shm_internal::kLine) ShmProcessGroup::Arrival {
  uint64_t region;  // allocate_buffer call number, 0: the buffer is not shared
  uint64_t offset;  // of the buffer in the rank's part of that allocation
  uint64_t count;
  uint32_t dtype;
  uint32_t op;
  uint32_t kind;  // InPlaceKind
};

// One allocate_buffer call: every rank's part, mapped here; maps[rank()] is this rank's own.
struct ShmProcessGroup::SharedRegion {
  uint64_t id = 0;
  std::vector<ShmSegment> maps;
};

}  // namespace meshtrain::comm
