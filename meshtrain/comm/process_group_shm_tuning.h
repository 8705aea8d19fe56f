// The defaults a ShmProcessGroup tunes itself with (ShmProcessGroup::tune, which also reads their
// MESHTRAIN_SHM_* overrides) and the waiting policy's time slices. Private to the
// process_group_shm*.cpp files.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace meshtrain::comm::shm_internal {

// Waiting: spin on the word while every rank has a core of its own (a peer is running and will
// be there in well under a microsecond), give the core away with sched_yield for a moment (other
// processes on the machine may hold the peer's core), and then sleep on the futex, which costs a
// system call and a wake-up on both sides. With more ranks than cores the peer we wait for is
// often queued behind us on this very core: spin only a few iterations, then yield for longer
// before sleeping. A yield hands the core straight to a runnable peer, where a futex sleep waits
// for the scheduler to notice the wake-up: with 4 ranks on 2 cores a 4 KiB all-reduce took 3-5x
// less time yielding for 300 us than sleeping at once.
constexpr auto kSpinFor = std::chrono::microseconds(20);
constexpr int kOversubscribedSpins = 64;
constexpr auto kYieldFor = std::chrono::microseconds(50);
constexpr auto kOversubscribedYieldFor = std::chrono::microseconds(300);
constexpr auto kSleepSlice = std::chrono::milliseconds(20);
// Operations up to this size run on the thread that issues them (ProcessGroupBase::inline_bytes);
// MESHTRAIN_SHM_INLINE_BYTES overrides it (0 sends every operation to the group's thread).
constexpr size_t kDefaultInlineBytes = size_t{64} << 10;
// An all-reduce moves through the staging buffers in steps this large (per rank), so that a
// step's data is still in cache when it is reduced and copied out. MESHTRAIN_SHM_STEP_BYTES
// overrides it for tuning.
constexpr size_t kDefaultStepBytes = size_t{128} << 10;
// All-reduces up to this size (up to one step with two ranks) are reduced whole by every rank, in
// rank order, straight into its output: one meeting instead of two. Reducing 1/N each and
// copying the slices out gives the same bits, since both combine in rank order.
constexpr size_t kWholeReduceBytes = size_t{32} << 10;
// With more ranks than cores a meeting costs a round of context switches, which outweighs the
// extra reading of a whole reduce up to about this size (3, 4 and 8 ranks on 2 cores: 1.5-3x
// faster at 128 KiB-1 MiB than slicing; slower from 2 MiB on).
constexpr size_t kOversubscribedWholeReduceBytes = size_t{1} << 20;
// All-reduces from this size on buffers from allocate_buffer run in place, without staging copies
// or meetings. With more ranks than cores, the ranks that wait for the last arrival cost more
// context switches than the staging copies up to about twice that (4 ranks on 2 cores, 256 KiB:
// 0.6x the staged path; 512 KiB: 1.2x). MESHTRAIN_SHM_SHARED_MIN_BYTES overrides both.
constexpr size_t kSharedMinBytes = size_t{256} << 10;
constexpr size_t kOversubscribedSharedMinBytes = size_t{512} << 10;
// An in-place all-reduce is reduced in chunks of this size, each claimed by whichever rank runs
// the operation at the time: small enough for two ranks that run it together to share the work
// evenly, large enough that a claim (one atomic on a shared line) costs nothing against the
// copying. MESHTRAIN_SHM_SHARED_CHUNK_BYTES overrides it.
constexpr size_t kSharedChunkBytes = size_t{64} << 10;
// Without a spare core per rank, an asynchronous in-place all-reduce waits this long for its
// issuer to run it (on wait) before the group's thread takes it: DDP waits for its buckets only
// after backward, and a rank that waits then reduces the buckets of the peers still computing, on
// a core of its own, instead of the group's thread taking the core from backward. With a spare
// core per rank the group's thread takes it as soon as any operation (and reduces while backward
// goes on). MESHTRAIN_SHM_IN_PLACE_LEAVE_US overrides the choice.
constexpr auto kInPlaceLeaveToIssuer = std::chrono::milliseconds(100);

// Reads every MESHTRAIN_SHM_* override once, so that a malformed one fails the group before it
// makes anything (ValueError naming the variable), not halfway through.
void check_shm_overrides();

}  // namespace meshtrain::comm::shm_internal
