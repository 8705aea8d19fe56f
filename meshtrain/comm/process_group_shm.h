// The shm backend: every rank of the group is on one host and maps one POSIX shared-memory
// segment. Each rank owns two staging buffers in it; a collective copies data into its own
// buffer, meets the others at a barrier, and computes its part straight from every rank's
// buffer. A small all-reduce is one meeting, after which every rank reduces all buffers in rank
// order; a large one is a reduce-scatter and an all-gather in cache-sized steps, pipelined so
// that each step costs one meeting (each rank stages only what the others reduce, reduces its
// own slice and publishes it). Other large messages go through in chunks that alternate between
// the two buffers, so one barrier per phase suffices. Buffers from allocate_buffer are mapped
// into every rank: an all-reduce whose buffers all come from one such call runs in place, without
// staging copies or meetings. Each rank announces its buffer when it issues the operation; once
// all have, whichever ranks run it (a rank that waits for it, typically while its peers still
// compute) claim chunks, reduce each from every buffer and write the result into all of them, so
// that no rank needs its peers on a core at the same moment. Small operations run on the issuing
// thread (ProcessGroupBase::inline_bytes). Point-to-point messages go through a byte ring per
// ordered pair of ranks. Waiting ranks spin briefly, then sleep on a futex; while waiting they
// check that the ranks they wait for are still alive.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "meshtrain/comm/process_group_base.h"
#include "meshtrain/comm/transport/shm_segment.h"
#include "meshtrain/comm/transport/shm_transport.h"

namespace meshtrain::comm {

class ShmProcessGroup final : public ProcessGroupBase {
 public:
  ShmProcessGroup(std::shared_ptr<Store> store, int rank, int size, ProcessGroupOptions opts);
  ~ShmProcessGroup() override;

  // Every rank's allocation is mapped into every other rank (one POSIX shared-memory object per
  // rank and call, unlinked once all have mapped it).
  CommBufferPtr allocate_buffer(size_t bytes) override;
  // All-reduces that ran in place on shared buffers (the others were staged).
  uint64_t in_place_all_reduces() const {
    return in_place_all_reduces_.load(std::memory_order_relaxed);
  }
  // Reduce-scatters and all-gathers that ran in place on shared buffers: each rank reads its
  // peers' buffers directly (ZeRO's gradient shards and parameter gathers).
  uint64_t in_place_reduce_scatters() const {
    return in_place_reduce_scatters_.load(std::memory_order_relaxed);
  }
  uint64_t in_place_all_gathers() const {
    return in_place_all_gathers_.load(std::memory_order_relaxed);
  }
  // More ranks than the cores that the ranks may use together (their affinity masks, joined), or,
  // for a group split off the job's first, more of the job's ranks on the host than their cores:
  // waits yield sooner and messages go in fewer, larger steps.
  bool oversubscribed() const { return oversubscribed_; }
  // The size of the shared segment and of each rank's two staging buffers, as fitted to the
  // group's share of /dev/shm.
  size_t segment_bytes() const { return segment_.size(); }
  size_t staging_bytes() const { return chunk_bytes_; }
  // The size of a segment for `ranks` ranks with the given staging buffers and channels; the
  // smallest one the group ever makes; and the smallest segments of a first group of `ranks` and
  // the groups planned off it, together (what /dev/shm must hold at least).
  static size_t segment_bytes_for(int ranks, size_t chunk_bytes, size_t channel_bytes);
  static size_t smallest_segment_bytes(int ranks);
  static uint64_t smallest_segments(int ranks, const std::vector<int>& planned);
  // Chunks of in-place all-reduces that this rank reduced (for every rank).
  uint64_t in_place_chunks_reduced() const {
    return in_place_chunks_.load(std::memory_order_relaxed);
  }

 protected:
  void run_all_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op) override;
  void run_broadcast(OpContext& ctx, void* data, size_t count, DType dtype, int root) override;
  void run_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
                  int root) override;
  void run_all_gather_v(OpContext& ctx, const void* input, void* output,
                        const std::vector<size_t>& counts, DType dtype) override;
  void run_reduce_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                          DType dtype, ReduceOp op) override;
  void run_gather(OpContext& ctx, const void* input, void* output, size_t count, DType dtype,
                  int root) override;
  void run_scatter(OpContext& ctx, const void* input, void* output, size_t count, DType dtype,
                   int root) override;
  void run_all_to_all(OpContext& ctx, const void* input, void* output, size_t count,
                      DType dtype) override;
  void run_all_to_all_v(OpContext& ctx, const void* input, const std::vector<size_t>& send_counts,
                        void* output, const std::vector<size_t>& recv_counts, DType dtype) override;
  Transport& p2p_transport() override { return *transport_; }
  void run_barrier(OpContext& ctx) override;

  void on_abort(const std::string& reason) override;
  std::vector<int> waiting_for() const override;
  std::string algorithm_label(const OpContext& ctx) const override;
  size_t inline_bytes() const override { return inline_bytes_; }
  int64_t on_issue_all_reduce(void* data, size_t count, DType dtype, ReduceOp op) override;
  int64_t on_issue_reduce_scatter(const void* input, size_t count, DType dtype,
                                  ReduceOp op) override;
  int64_t on_issue_all_gather(const void* input, void* output, size_t count, DType dtype) override;
  std::chrono::microseconds leave_to_issuer(const OpContext& ctx) const override;

 private:
  struct Header;
  struct RankBlock;
  struct SharedRegion;
  struct Slot;
  struct Arrival;
  // Which collective an in-place ticket is for (every rank must agree).
  enum class InPlaceKind : uint32_t { all_reduce = 0, reduce_scatter = 1, all_gather = 2 };
  // A collective announced for the in-place path, from its issue to its run.
  struct Pending {
    uint64_t ticket = 0;
    InPlaceKind kind = InPlaceKind::all_reduce;
    bool arrived = false;  // announced at issue (else at run, once its slot is free)
    std::shared_ptr<SharedRegion> region;  // null: this rank's buffer is not shared
    size_t offset = 0;
    size_t count = 0;  // of the shared buffer: the whole input (reduce-scatter) or output
    DType dtype = DType::f32;
    ReduceOp op = ReduceOp::sum;
  };
  // Takes a ticket for an in-place collective on `count` elements at `buffer` (null: this
  // rank's buffer cannot be shared, the operation will be staged on every rank).
  int64_t issue_in_place(InPlaceKind kind, const void* buffer, size_t count, DType dtype,
                         ReduceOp op);
  // Runs the ticket's announcement: waits for the slot and every rank's arrival. Returns whether
  // the operation runs in place; `p` and `base` (every rank's buffer) describe it.
  bool enter_in_place(OpContext& ctx, Pending& p, std::vector<uint8_t*>& base);
  // The last rank to leave opens the ticket's slot for its next round.
  void leave_in_place(const Pending& p);
  // Waits until `need` ranks (or chunks) marked themselves done in the ticket's slot.
  void wait_in_place_done(OpContext& ctx, const Pending& p, uint32_t need, const char* what);
  // Enters the ticket's in-place collective, runs this rank's `part` on every rank's buffer,
  // waits until every rank has done its part (so no owner reuses a buffer a peer still reads)
  // and leaves. False, having run nothing, when the operation must be staged.
  bool run_in_place_part(OpContext& ctx, const char* what,
                         const std::function<void(const std::vector<uint8_t*>&)>& part);
  bool reduce_scatter_in_place(OpContext& ctx, void* output, size_t count, DType dtype,
                               ReduceOp op);
  bool all_gather_in_place(OpContext& ctx, void* output, size_t count, DType dtype);

  void reduce_chunks(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op, int root);
  void all_gather_chunks(OpContext& ctx, const void* input, void* output,
                         const std::vector<size_t>& counts, DType dtype, int root);
  // The all-reduce on buffers that every rank allocated with the same allocate_buffer call, no
  // staging and no meetings: whichever ranks run it claim chunks, reduce each from every rank's
  // buffer in rank order and write the result into every buffer. Returns false when some rank's
  // buffer is elsewhere (every rank then takes the staged path).
  bool all_reduce_in_place(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op);
  Slot* slot(uint64_t ticket) const;
  Arrival* arrival(Slot* s, int rank) const;
  // Announces this rank's buffer in the ticket's slot; the last rank to do so decides whether
  // the operation runs in place.
  void arrive(const Pending& p);
  // Wakes the ranks sleeping on the in-place slots' state.
  void signal();
  // The allocation that holds [p, p + bytes) on this rank, or null; `offset` is p's place in it.
  std::shared_ptr<SharedRegion> find_region(const void* p, size_t bytes, size_t* offset);
  void begin_op(const OpContext& ctx);
  // All ranks meet; throws CommError naming the ranks that did not arrive.
  void meet(const OpContext& ctx);
  // Spins briefly, then sleeps on `word` until ready() holds. `peers` are the ranks that can
  // make it true (for liveness checks and error messages).
  template <typename Ready>
  void wait_until(const OpContext& ctx, std::atomic<uint32_t>* word, Ready ready,
                  const std::vector<int>& peers, const char* what);
  void check_peers(const OpContext& ctx, const std::vector<int>& peers, const char* what);

  uint8_t* buffer(int rank, uint64_t parity) const;
  // Waiting and message-cutting settings for `ranks` ranks sharing `cpus` cores.
  void tune(int ranks, int cpus);
  // Where the rank blocks start: right after the header.
  static size_t blocks_offset();
  // Places the parts of the segment for the current chunk_bytes_ and channel_bytes_; returns
  // the segment's size.
  size_t lay_out_segment();
  // Rank 0: halves the staging buffers, then the channels, until the segment takes at most the
  // group's share of the job's budget (without one, half of what /dev/shm has free: the rest is
  // for buffers from allocate_buffer), or they are at their smallest.
  void fit_segment_to_dev_shm(uint64_t free_bytes);
  static size_t min_chunk_bytes(int ranks);
  static constexpr size_t kMinChannelBytes = size_t{32} << 10;

  std::string segment_name_;
  ShmSegment segment_;
  Header* header_ = nullptr;
  RankBlock* blocks_ = nullptr;
  size_t chunk_bytes_ = 0;
  size_t step_bytes_ = 0;                   // all-reduce step per rank (<= chunk_bytes_)
  size_t whole_bytes_ = 0;                  // steps up to this size are reduced whole by every rank
  size_t inline_bytes_ = 0;                 // operations up to this size run on the issuing thread
  bool oversubscribed_ = false;             // more ranks than cores: yield instead of spinning
  std::chrono::microseconds spin_for_{0};   // a waiter spins this long,
  std::chrono::microseconds yield_for_{0};  // then yields this long, then sleeps
  size_t channel_bytes_ = 0;
  size_t channel_stride_ = 0;
  size_t channels_offset_ = 0;
  size_t buffers_offset_ = 0;
  uint64_t epoch_ = 0;          // barriers passed by this rank
  uint64_t chunk_counter_ = 0;  // chunks staged, which picks the buffer parity
  std::unique_ptr<ShmTransport> transport_;
  size_t shared_min_bytes_ = 0;    // all-reduces from this size try the shared-buffer path
  size_t shared_chunk_bytes_ = 0;  // what one claim of an in-place all-reduce reduces
  // How long an in-place all-reduce is left to its issuer; unset: as any other operation.
  std::optional<std::chrono::microseconds> in_place_leave_;
  size_t slots_offset_ = 0;
  size_t slot_stride_ = 0;
  uint64_t tickets_issued_ = 0;  // guarded by the base's queue lock (on_issue_all_reduce)
  std::mutex pending_mu_;
  std::deque<Pending> pending_;  // issued, not yet run, in order
  std::atomic<uint64_t> in_place_chunks_{0};
  uint64_t regions_made_ = 0;  // allocate_buffer calls (the same on every rank)
  // Set once every rank holds an allocation; from then on large all-reduces check for one. Set
  // after a barrier, so every rank sees it from the same operation on.
  std::atomic<bool> has_regions_{false};
  std::atomic<uint64_t> in_place_all_reduces_{0};
  std::atomic<uint64_t> in_place_reduce_scatters_{0};
  std::atomic<uint64_t> in_place_all_gathers_{0};
  std::mutex regions_mu_;
  std::vector<std::weak_ptr<SharedRegion>> regions_;
};

}  // namespace meshtrain::comm
