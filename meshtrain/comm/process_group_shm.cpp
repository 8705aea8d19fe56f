// ShmProcessGroup: segment layout, rendezvous, barrier, chunked collectives, pair rings.
#include "meshtrain/comm/process_group_shm.h"

#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <utility>

#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {
namespace {

constexpr uint64_t kMagic = 0x6d7473686d763033ull;  // "mtshmv03"
constexpr size_t kLine = 64;
constexpr int kCpuWords = 16;  // cores 0-1023 in a rank's published affinity
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
// In-place all-reduces in flight at once (issued by some rank, not yet finished by every rank).
// A rank that issues more before the oldest is done announces the newer ones when they run.
constexpr uint64_t kSlots = 64;
// Without a spare core per rank, an asynchronous in-place all-reduce waits this long for its
// issuer to run it (on wait) before the group's thread takes it: DDP waits for its buckets only
// after backward, and a rank that waits then reduces the buckets of the peers still computing, on
// a core of its own, instead of the group's thread taking the core from backward. With a spare
// core per rank the group's thread takes it as soon as any operation (and reduces while backward
// goes on). MESHTRAIN_SHM_IN_PLACE_LEAVE_US overrides the choice.
constexpr auto kInPlaceLeaveToIssuer = std::chrono::milliseconds(100);

size_t env_bytes(Env id, size_t fallback, bool allow_zero = false) {
  const auto text = env_value(id);
  if (!text) return fallback;
  const char* v = text->c_str();
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  return end != v && (x > 0 || allow_zero) ? static_cast<size_t>(x) : fallback;
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}

// How a large all-reduce of `count` elements is cut into steps of `step_elems` and each step into
// one slice per rank. Slices are cache-line aligned so that ranks never write the same line, and
// sit at the same place in every step (the last step may be short, and so its later slices).
struct StepSlices {
  StepSlices(size_t step, size_t total, int n, size_t es)
      : step_elems(step),
        count(total),
        per(round_up((std::min(step, total) + n - 1) / n, std::max<size_t>(1, kLine / es))) {}
  size_t steps() const { return (count + step_elems - 1) / step_elems; }
  size_t step_len(size_t k) const { return std::min(step_elems, count - k * step_elems); }
  // Rank q's slice [lo, hi) of a step of m elements, from the step's start.
  std::pair<size_t, size_t> slice(size_t m, int q) const {
    const size_t lo = std::min(m, per * static_cast<size_t>(q));
    return {lo, std::min(m, lo + per)};
  }
  size_t step_elems, count, per;
};

std::string random_suffix() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << ::getpid() << '-' << rd() << rd();
  return os.str();
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << ']';
  return os.str();
}

}  // namespace

struct ShmProcessGroup::Header {
  std::atomic<uint64_t> magic;
  uint32_t size;
  uint32_t pad0;
  uint64_t chunk_bytes;
  uint64_t channel_bytes;
  std::atomic<uint32_t> aborted;
  int32_t abort_rank;
  char abort_reason[400];
  alignas(kLine) std::atomic<uint64_t> arrivals;  // barrier arrivals, all ranks, ever
  alignas(kLine) std::atomic<uint32_t> epoch;     // last completed barrier (futex word)
  std::atomic<uint32_t> mapped;
  alignas(kLine) std::atomic<uint32_t> sleepers;  // ranks asleep on a futex: wake only if any
  alignas(kLine) std::atomic<uint32_t> signal;    // bumped when an in-place slot changes (futex)
};

struct alignas(kLine) ShmProcessGroup::RankBlock {
  uint64_t cpus[kCpuWords];  // the cores this rank may run on (its affinity), set before the first
                             // barrier
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> arrived;   // last barrier this rank arrived at (low 32 bits)
  std::atomic<uint64_t> seq;       // the operation it runs (+1; 0 = none yet)
  std::atomic<uint32_t> doorbell;  // rung by peers that touched a ring shared with this rank
};

// One in-place all-reduce in flight: ticket t uses slot t % kSlots in its round t / kSlots. The
// last rank to leave resets the slot and opens it for the next round.
struct alignas(kLine) ShmProcessGroup::Slot {
  std::atomic<uint64_t> open_round;  // the round that may use the slot now
  std::atomic<uint32_t> arrivals;
  std::atomic<uint32_t> verdict;  // 0: not all arrived; 1: in place; 2: staged
  std::atomic<uint32_t> left;
  alignas(kLine) std::atomic<uint32_t> next_chunk;  // claims
  alignas(kLine) std::atomic<uint32_t> chunks_done;
};

// What a rank announced for the slot's operation (followed by the next rank's, one line each).
struct alignas(kLine) ShmProcessGroup::Arrival {
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

namespace {

class SharedCommBuffer final : public CommBuffer {
 public:
  SharedCommBuffer(uint8_t* data, size_t bytes, std::shared_ptr<const void> keep)
      : CommBuffer(data, bytes), keep_(std::move(keep)) {}
  bool shared() const override { return true; }

 private:
  std::shared_ptr<const void> keep_;  // the region: mappings live while the buffer does
};

}  // namespace

ShmProcessGroup::ShmProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                 ProcessGroupOptions opts)
    : ProcessGroupBase(std::move(store), rank, size, std::move(opts), "shm") {
  const int n = size;
  chunk_bytes_ = round_up(std::max<size_t>(options().shm_chunk_bytes, kLine * n), kLine);
  channel_bytes_ = n <= 16 ? (size_t{256} << 10) : (size_t{64} << 10);
  const std::string key = key_prefix() + "shm/segment";
  if (rank == 0) {
    segment_name_ = "/meshtrain-" + random_suffix();
    // A container's /dev/shm is 64 MiB by default: 8 ranks' segment (80 MiB) would not fit.
    fit_segment_to_dev_shm();
    const size_t total = lay_out_segment();
    try {
      // Every page is reserved now: a /dev/shm too small even for the smallest segment fails
      // here, on every rank, with an error instead of a SIGBUS in the middle of a collective.
      segment_ = ShmSegment::create(segment_name_, total, /*reserve=*/true);
    } catch (const CommError& e) {
      const std::string what = detail::str_cat(
          "the shm process group of ", n, " ranks cannot be made: ", e.what(),
          "; give the job a larger /dev/shm (docker run --shm-size, a memory-backed emptyDir "
          "in Kubernetes) or use the tcp backend");
      this->store()->set_string(key, "!" + what);  // the other ranks fail with the same line
      MT_THROW(CommError, what);
    }
    auto* h = reinterpret_cast<Header*>(segment_.data());
    h->size = static_cast<uint32_t>(n);
    h->chunk_bytes = chunk_bytes_;
    h->channel_bytes = channel_bytes_;
    h->magic.store(kMagic, std::memory_order_release);
    this->store()->set_string(
        key, detail::str_cat(segment_name_, " ", chunk_bytes_, " ", channel_bytes_));
  } else {
    const std::string value = this->store()->get_string(key);
    if (!value.empty() && value[0] == '!') MT_THROW(CommError, "rank 0: ", value.substr(1));
    std::istringstream in(value);
    in >> segment_name_ >> chunk_bytes_ >> channel_bytes_;
    MT_CHECK(!in.fail() && !segment_name_.empty() && segment_name_[0] == '/' &&
                 segment_name_.size() < 200 && chunk_bytes_ >= kLine * n && channel_bytes_ > 0,
             "bad shm segment description in the store: '", value, "'");
    segment_ = ShmSegment::open(segment_name_, lay_out_segment());
  }
  tune(usable_cpus());  // this rank's own cores until every rank has said which it may use
  header_ = reinterpret_cast<Header*>(segment_.data());
  blocks_ = reinterpret_cast<RankBlock*>(segment_.data() + blocks_offset());
  if (header_->magic.load(std::memory_order_acquire) != kMagic || header_->size != uint32_t(n) ||
      header_->chunk_bytes != chunk_bytes_ || header_->channel_bytes != channel_bytes_) {
    MT_THROW(CommError, "shm segment ", segment_name_,
             " does not match this group (size or options differ between ranks)");
  }
  blocks_[rank].pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  {
    cpu_set_t own;
    CPU_ZERO(&own);
    if (::sched_getaffinity(0, sizeof(own), &own) == 0) {
      for (int c = 0; c < CPU_SETSIZE && c < 64 * kCpuWords; ++c) {
        if (CPU_ISSET(c, &own)) blocks_[rank].cpus[c / 64] |= uint64_t{1} << (c % 64);
      }
    }
  }
  // The last rank to map the segment removes its name: nothing is left behind in /dev/shm
  // even when the job is killed later.
  if (header_->mapped.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(n)) {
    ShmSegment::unlink(segment_name_);
  }
  ShmTransportLayout layout;
  layout.rings = segment_.data() + channels_offset_;
  layout.ring_stride = channel_stride_;
  layout.ring_bytes = channel_bytes_;
  layout.doorbell = [this](int q) { return &blocks_[q].doorbell; };
  layout.alive = [this](int q) {
    return process_alive(blocks_[q].pid.load(std::memory_order_acquire));
  };
  layout.remote_abort = [this]() -> std::string {
    if (header_->aborted.load(std::memory_order_acquire) != 1) return {};
    return detail::str_cat("rank ", header_->abort_rank,
                           " aborted the group: ", std::string(header_->abort_reason));
  };
  transport_ = std::make_unique<ShmTransport>(rank, size, std::move(layout));
  start();
  // Everyone mapped and alive before the first operation.
  barrier(BarrierOptions{})->wait();
  // The cores the group's ranks may use together decide how to wait and how to cut messages:
  // ranks bound to a core each (meshrun --bind-cores-to-rank) are not more ranks than cores.
  int group_cpus = 0;
  for (int w = 0; w < kCpuWords; ++w) {
    uint64_t any = 0;
    for (int q = 0; q < n; ++q) any |= blocks_[q].cpus[w];
    group_cpus += std::popcount(any);
  }
  if (group_cpus > 0) tune(group_cpus);
}

size_t ShmProcessGroup::blocks_offset() {
  return round_up(sizeof(Header), kLine);
}

size_t ShmProcessGroup::lay_out_segment() {
  const size_t n = static_cast<size_t>(size());
  size_t offset = blocks_offset() + sizeof(RankBlock) * n;
  slots_offset_ = offset;
  slot_stride_ = sizeof(Slot) + sizeof(Arrival) * n;
  offset += slot_stride_ * kSlots;
  buffers_offset_ = round_up(offset, 4096);
  offset = buffers_offset_ + chunk_bytes_ * 2 * n;
  channels_offset_ = round_up(offset, 4096);
  channel_stride_ = ShmTransport::stride_for(channel_bytes_);
  return channels_offset_ + channel_stride_ * n * n;
}

void ShmProcessGroup::fit_segment_to_dev_shm() {
  const std::optional<DevShmSpace> space = dev_shm_space();
  if (!space) return;  // the reservation will tell
  const uint64_t free_bytes = space->free_bytes;
  const size_t min_chunk =
      round_up(std::max<size_t>(size_t{256} << 10, kLine * static_cast<size_t>(size())), kLine);
  const size_t min_channel = size_t{32} << 10;
  const size_t chunk = chunk_bytes_, channel = channel_bytes_;
  while (lay_out_segment() > free_bytes / 2) {
    if (chunk_bytes_ > min_chunk) {
      chunk_bytes_ = std::max(min_chunk, round_up(chunk_bytes_ / 2, kLine));
    } else if (channel_bytes_ > min_channel) {
      channel_bytes_ = std::max(min_channel, channel_bytes_ / 2);
    } else {
      break;
    }
  }
  if (chunk_bytes_ != chunk || channel_bytes_ != channel) {
    MT_LOG_WARN("comm", "shm group of ", size(), " ranks: /dev/shm has ", format_mib(free_bytes),
                " free, so its staging buffers are cut from ", chunk >> 10, " to ",
                chunk_bytes_ >> 10, " KiB and its channels from ", channel >> 10, " to ",
                channel_bytes_ >> 10, " KiB (", format_mib(lay_out_segment()),
                " in all; collectives on private buffers get slower); a larger /dev/shm "
                "(docker run --shm-size) restores them");
  }
}

void ShmProcessGroup::tune(int cpus) {
  const int n = size();
  oversubscribed_ = n > cpus;
  // With more ranks than cores every meeting costs context switches, which outweigh keeping a
  // step in cache: take steps as large as the staging buffers.
  step_bytes_ = std::min(
      chunk_bytes_,
      round_up(env_bytes(Env::shm_step_bytes, oversubscribed_ ? chunk_bytes_ : kDefaultStepBytes),
               kLine));
  whole_bytes_ = env_bytes(Env::shm_whole_bytes,
                           oversubscribed_ ? kOversubscribedWholeReduceBytes : kWholeReduceBytes);
  inline_bytes_ = env_bytes(Env::shm_inline_bytes, kDefaultInlineBytes, true);
  spin_for_ = std::chrono::microseconds(
      env_bytes(Env::shm_spin_us, static_cast<size_t>(kSpinFor.count()), true));
  yield_for_ = std::chrono::microseconds(env_bytes(
      Env::shm_yield_us,
      static_cast<size_t>((oversubscribed_ ? kOversubscribedYieldFor : kYieldFor).count()), true));
  shared_min_bytes_ = env_bytes(Env::shm_shared_min_bytes,
                                oversubscribed_ ? kOversubscribedSharedMinBytes : kSharedMinBytes);
  shared_chunk_bytes_ = round_up(env_bytes(Env::shm_shared_chunk_bytes, kSharedChunkBytes), kLine);
  in_place_leave_.reset();
  if (const size_t us = env_bytes(Env::shm_in_place_leave_us, 0); us > 0) {
    in_place_leave_ = std::chrono::microseconds(us);
  } else if (cpus < 2 * n) {
    in_place_leave_ = kInPlaceLeaveToIssuer;
  }
}

ShmProcessGroup::~ShmProcessGroup() {
  stop();
  transport_.reset();
}

uint8_t* ShmProcessGroup::buffer(int rank, uint64_t parity) const {
  return segment_.data() + buffers_offset_ + chunk_bytes_ * (2 * rank + (parity & 1));
}

CommBufferPtr ShmProcessGroup::allocate_buffer(size_t bytes) {
  const int n = size();
  if (n == 1) return CommBuffer::allocate_private(bytes);
  const size_t mapped = round_up(std::max<size_t>(bytes, 1), 4096);
  auto region = std::make_shared<SharedRegion>();
  region->id = ++regions_made_;
  auto name = [&](int q) { return detail::str_cat(segment_name_, "-b", region->id, "-r", q); };
  region->maps.resize(n);
  // The name goes once every peer has mapped the part, or when this call fails: nothing is left
  // behind in /dev/shm either way.
  struct UnlinkOwn {
    std::string name;
    ~UnlinkOwn() { ShmSegment::unlink(name); }
  } unlink_own{name(rank())};
  int32_t created = 1;
  try {
    region->maps[rank()] = ShmSegment::create(name(rank()), mapped, /*reserve=*/true);
  } catch (const CommError& e) {
    MT_LOG_WARN("comm", "rank ", rank(), ": ", e.what(), "; collective buffers stay private");
    created = 0;
  }
  // Also the meeting after which every part exists. Where one rank could not make its part
  // (a full /dev/shm, as in a container with the default 64 MiB), every rank falls back alike.
  all_reduce(&created, 1, DType::i32, {.op = ReduceOp::min, .async_op = false})->wait();
  if (created == 0) return CommBuffer::allocate_private(bytes);
  for (int q = 0; q < n; ++q) {
    if (q != rank()) region->maps[q] = ShmSegment::open(name(q), mapped, /*populate=*/true);
  }
  barrier(BarrierOptions{})->wait();  // every part is mapped everywhere
  {
    std::lock_guard<std::mutex> lock(regions_mu_);
    std::erase_if(regions_, [](const std::weak_ptr<SharedRegion>& r) { return r.expired(); });
    regions_.push_back(region);
  }
  has_regions_.store(true, std::memory_order_release);
  uint8_t* data = region->maps[rank()].data();
  return std::make_unique<SharedCommBuffer>(data, bytes, std::move(region));
}

std::shared_ptr<ShmProcessGroup::SharedRegion> ShmProcessGroup::find_region(const void* p,
                                                                            size_t bytes,
                                                                            size_t* offset) {
  const auto* b = static_cast<const uint8_t*>(p);
  std::lock_guard<std::mutex> lock(regions_mu_);
  for (const auto& weak : regions_) {
    auto r = weak.lock();
    if (!r) continue;
    const ShmSegment& own = r->maps[rank()];
    if (b >= own.data() && b + bytes <= own.data() + own.size()) {
      *offset = static_cast<size_t>(b - own.data());
      return r;
    }
  }
  return nullptr;
}

void ShmProcessGroup::on_abort(const std::string& reason) {
  if (header_ == nullptr) return;
  uint32_t expected = 0;
  if (header_->aborted.compare_exchange_strong(expected, 2, std::memory_order_acq_rel)) {
    header_->abort_rank = rank();
    size_t n = std::min(reason.size(), sizeof(header_->abort_reason) - 1);
    std::memcpy(header_->abort_reason, reason.data(), n);
    header_->abort_reason[n] = '\0';
    header_->aborted.store(1, std::memory_order_release);
  }
  // Wake everyone wherever they sleep.
  header_->epoch.fetch_add(0, std::memory_order_release);
  futex_wake_all(&header_->epoch);
  header_->signal.fetch_add(1, std::memory_order_release);
  futex_wake_all(&header_->signal);
  if (transport_) transport_->abort(reason);
}

std::vector<int> ShmProcessGroup::waiting_for() const {
  std::vector<int> out;
  uint32_t mine = blocks_[rank()].arrived.load(std::memory_order_acquire);
  for (int q = 0; q < size(); ++q) {
    uint32_t theirs = blocks_[q].arrived.load(std::memory_order_acquire);
    if (static_cast<int32_t>(theirs - mine) < 0) out.push_back(q);
  }
  return out;
}

std::string ShmProcessGroup::algorithm_label(const OpContext& ctx) const {
  (void)ctx;
  return "shm-slots";
}

void ShmProcessGroup::check_peers(const OpContext& ctx, const std::vector<int>& peers,
                                  const char* what) {
  std::vector<int> dead;
  for (int q : peers) {
    if (!process_alive(blocks_[q].pid.load(std::memory_order_acquire))) dead.push_back(q);
  }
  if (!dead.empty()) {
    std::ostringstream os;
    os << "ranks " << join_ranks(dead) << " did not answer (" << what << "): ";
    for (size_t i = 0; i < dead.size(); ++i) {
      os << (i ? ", " : "") << "rank " << dead[i] << " (pid " << blocks_[dead[i]].pid.load()
         << ") has exited";
    }
    (void)ctx;
    throw CommError(os.str());
  }
}

template <typename Ready>
void ShmProcessGroup::wait_until(const OpContext& ctx, std::atomic<uint32_t>* word, Ready ready,
                                 const std::vector<int>& peers, const char* what) {
  if (oversubscribed_) {
    for (int i = 0; i < kOversubscribedSpins; ++i) {
      if (ready()) return;
      _mm_pause();
    }
  } else {
    // A core each, as far as this group knows: spin a little, then yield (other processes on the
    // machine may hold the other core, leaving this group's ranks to share one).
    const auto spin_until = std::chrono::steady_clock::now() + spin_for_;
    for (int i = 0; spin_for_.count() > 0; ++i) {
      if (ready()) return;
      _mm_pause();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() >= spin_until) break;
    }
  }
  auto last_check = std::chrono::steady_clock::now();
  const auto yield_until = last_check + yield_for_;
  for (;;) {
    uint32_t seen = word->load(std::memory_order_acquire);
    if (ready()) return;
    if (header_->aborted.load(std::memory_order_acquire) == 1) {
      MT_THROW(CommError, "rank ", header_->abort_rank,
               " aborted the group: ", std::string(header_->abort_reason));
    }
    throw_if_aborted();
    auto now = std::chrono::steady_clock::now();
    if (now - last_check >= std::chrono::milliseconds(50)) {
      check_peers(ctx, peers, what);
      last_check = now;
    }
    if (now >= ctx.deadline) {
      std::ostringstream os;
      os << "timed out after " << ctx.timeout.count() << " ms; ranks " << join_ranks(peers)
         << " did not answer (" << what << ")";
      for (int q : peers) {
        uint64_t s = blocks_[q].seq.load(std::memory_order_acquire);
        if (s == 0) {
          os << "; rank " << q << " has run no operation";
        } else {
          os << "; rank " << q << " is at seq " << s - 1;
        }
      }
      throw CommError(os.str());
    }
    if (now < yield_until) {
      ::sched_yield();
      continue;
    }
    auto left = std::chrono::duration_cast<std::chrono::microseconds>(ctx.deadline - now);
    // Announce the sleep so that the waker makes the system call; the futex re-checks the word,
    // so a wake-up between the check above and the sleep is not lost.
    header_->sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (!ready()) futex_wait(word, seen, std::min<std::chrono::microseconds>(left, kSleepSlice));
    header_->sleepers.fetch_sub(1, std::memory_order_seq_cst);
  }
}

void ShmProcessGroup::begin_op(const OpContext& ctx) {
  blocks_[rank()].seq.store(ctx.seq + 1, std::memory_order_release);
}

void ShmProcessGroup::meet(const OpContext& ctx) {
  const uint64_t e = ++epoch_;
  blocks_[rank()].arrived.store(static_cast<uint32_t>(e), std::memory_order_release);
  uint64_t total = header_->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1;
  if (total == e * static_cast<uint64_t>(size())) {
    header_->epoch.store(static_cast<uint32_t>(e), std::memory_order_seq_cst);
    if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&header_->epoch);
    return;
  }
  auto done = [&] {
    return static_cast<int32_t>(header_->epoch.load(std::memory_order_acquire) -
                                static_cast<uint32_t>(e)) >= 0;
  };
  if (done()) return;
  std::vector<int> missing;
  try {
    std::vector<int> others;
    for (int q = 0; q < size(); ++q) {
      if (q != rank()) others.push_back(q);
    }
    wait_until(ctx, &header_->epoch, done, others, "barrier");
  } catch (const CommError& err) {
    for (int q = 0; q < size(); ++q) {
      uint32_t a = blocks_[q].arrived.load(std::memory_order_acquire);
      if (static_cast<int32_t>(a - static_cast<uint32_t>(e)) < 0) missing.push_back(q);
    }
    std::string msg = err.what();
    // Name the ranks that did not arrive rather than every peer.
    if (msg.rfind("timed out", 0) == 0) {
      std::ostringstream os;
      os << "timed out after " << ctx.timeout.count() << " ms; ranks " << join_ranks(missing)
         << " did not arrive";
      for (int q : missing) {
        uint64_t s = blocks_[q].seq.load(std::memory_order_acquire);
        os << "; rank " << q << (s == 0 ? " has run no operation" : " is at seq ")
           << (s == 0 ? std::string() : std::to_string(s - 1));
      }
      throw CommError(os.str());
    }
    throw;
  }
}

// ---- collectives --------------------------------------------------------------------------

void ShmProcessGroup::reduce_chunks(OpContext& ctx, void* data, size_t count, DType dtype,
                                    ReduceOp op, int root) {
  begin_op(ctx);
  const int n = size();
  if (n == 1 || count == 0) return;
  const size_t es = dtype_size(dtype);
  const bool keep = root < 0 || root == rank();  // this rank ends with the result
  auto* bytes = static_cast<uint8_t*>(data);
  if (ctx.ticket >= 0 && all_reduce_in_place(ctx, data, count, dtype, op)) {
    return;
  }
  std::vector<const void*> srcs(n);
  if (n == 2 || count * es <= std::min(whole_bytes_, step_bytes_)) {
    // Small, or two ranks: one meeting per step, then every rank reduces the whole step in rank
    // order. With two ranks the slicing below saves nothing (each rank would still read the
    // other's whole step) and costs an extra copy: measured 3-5x slower at 1-64 MiB.
    const size_t step_elems = std::max<size_t>(1, step_bytes_ / es);
    for (size_t off = 0; off < count; off += step_elems) {
      const size_t m = std::min(step_elems, count - off);
      uint8_t* part = bytes + off * es;
      const uint64_t parity = chunk_counter_++;
      std::memcpy(buffer(rank(), parity), part, m * es);
      meet(ctx);
      if (keep) {
        for (int q = 0; q < n; ++q) srcs[q] = q == rank() ? part : buffer(q, parity);
        reduce_sources(part, srcs.data(), n, m, dtype, op, n);
      }
    }
    return;
  }
  // Large: reduce-scatter then all-gather through the staging buffers, one step at a time. Each
  // rank owns one slice of every step. It stages only the slices that the other ranks reduce,
  // reduces its own slice from its user buffer and their staged copies (in rank order, so every
  // rank's result has the same bits), and leaves the result in its own slice of its staging
  // buffer, from where the others copy it out. The phases of consecutive steps share a meeting:
  // after meeting k a rank reduces step k, copies out step k - 1 and stages step k + 1, in
  // buffers of alternating parity, so a step costs one meeting. Slice positions are the same in
  // every step (the last may be short), so that staging step k + 1 never overwrites the result
  // of step k - 1 that the others are still copying out.
  const StepSlices cut(std::max<size_t>(1, step_bytes_ / es), count, n, es);
  const size_t step_elems = cut.step_elems;
  const size_t steps = cut.steps();
  const uint64_t first = chunk_counter_;
  chunk_counter_ += steps;
  auto stage = [&](size_t k) {
    const size_t m = cut.step_len(k);
    auto [lo, hi] = cut.slice(m, rank());
    uint8_t* mine = buffer(rank(), first + k);
    const uint8_t* in = bytes + k * step_elems * es;
    if (lo > 0) std::memcpy(mine, in, lo * es);
    if (m > hi) std::memcpy(mine + hi * es, in + hi * es, (m - hi) * es);
  };
  auto reduce_own = [&](size_t k) {
    auto [lo, hi] = cut.slice(cut.step_len(k), rank());
    if (hi <= lo) return;
    uint8_t* user = bytes + (k * step_elems + lo) * es;
    uint8_t* result = buffer(rank(), first + k) + lo * es;
    for (int q = 0; q < n; ++q) srcs[q] = q == rank() ? user : buffer(q, first + k) + lo * es;
    if (root == rank()) {
      reduce_sources(user, srcs.data(), n, hi - lo, dtype, op, n);  // nobody copies it out
      return;
    }
    reduce_sources(result, srcs.data(), n, hi - lo, dtype, op, n);
    if (keep) std::memcpy(user, result, (hi - lo) * es);
  };
  auto copy_out = [&](size_t k) {
    if (!keep) return;
    const size_t m = cut.step_len(k);
    for (int q = 0; q < n; ++q) {
      auto [lo, hi] = cut.slice(m, q);
      if (q == rank() || hi <= lo) continue;
      std::memcpy(bytes + (k * step_elems + lo) * es, buffer(q, first + k) + lo * es,
                  (hi - lo) * es);
    }
  };
  stage(0);
  for (size_t k = 0; k < steps; ++k) {
    meet(ctx);
    reduce_own(k);
    if (k > 0) copy_out(k - 1);
    if (k + 1 < steps) stage(k + 1);
  }
  meet(ctx);
  copy_out(steps - 1);
}

ShmProcessGroup::Slot* ShmProcessGroup::slot(uint64_t ticket) const {
  return reinterpret_cast<Slot*>(segment_.data() + slots_offset_ +
                                 slot_stride_ * static_cast<size_t>(ticket % kSlots));
}

ShmProcessGroup::Arrival* ShmProcessGroup::arrival(Slot* s, int rank) const {
  return reinterpret_cast<Arrival*>(reinterpret_cast<uint8_t*>(s) + sizeof(Slot)) + rank;
}

void ShmProcessGroup::signal() {
  header_->signal.fetch_add(1, std::memory_order_release);
  if (header_->sleepers.load(std::memory_order_seq_cst) > 0) futex_wake_all(&header_->signal);
}

int64_t ShmProcessGroup::on_issue_all_reduce(void* data, size_t count, DType dtype, ReduceOp op) {
  return issue_in_place(InPlaceKind::all_reduce, data, count, dtype, op);
}

int64_t ShmProcessGroup::on_issue_reduce_scatter(const void* input, size_t count, DType dtype,
                                                 ReduceOp op) {
  return issue_in_place(InPlaceKind::reduce_scatter, input, count * static_cast<size_t>(size()),
                        dtype, op);
}

int64_t ShmProcessGroup::on_issue_all_gather(const void* input, void* output, size_t count,
                                             DType dtype) {
  // Peers read this rank's block where the output holds it: only an all-gather whose input is
  // its own block of the output (ZeRO's in-place gathers) can be shared.
  const bool own_block =
      input == static_cast<const uint8_t*>(output) + rank() * count * dtype_size(dtype);
  return issue_in_place(InPlaceKind::all_gather, own_block ? output : nullptr,
                        count * static_cast<size_t>(size()), dtype, ReduceOp::sum);
}

int64_t ShmProcessGroup::issue_in_place(InPlaceKind kind, const void* buffer, size_t count,
                                        DType dtype, ReduceOp op) {
  // The same decision on every rank: the same operations, sizes and allocate_buffer calls
  // (where this rank's buffer lies is announced, not decided here).
  if (size() == 1 || count * dtype_size(dtype) < shared_min_bytes_ ||
      !has_regions_.load(std::memory_order_acquire)) {
    return -1;
  }
  Pending p;
  p.ticket = tickets_issued_++;
  p.kind = kind;
  if (buffer != nullptr) p.region = find_region(buffer, count * dtype_size(dtype), &p.offset);
  p.count = count;
  p.dtype = dtype;
  p.op = op;
  // Announced now, on the issuing thread: the data is ready, and the ranks that reach the
  // operation later find everything they need to run it without waiting for this one.
  Slot* s = slot(p.ticket);
  if (s->open_round.load(std::memory_order_acquire) == p.ticket / kSlots) {
    arrive(p);
    p.arrived = true;
  }
  std::lock_guard<std::mutex> lock(pending_mu_);
  pending_.push_back(std::move(p));
  return static_cast<int64_t>(pending_.back().ticket);
}

std::chrono::microseconds ShmProcessGroup::leave_to_issuer(const OpContext& ctx) const {
  if (ctx.ticket >= 0 && in_place_leave_) return *in_place_leave_;
  return ProcessGroupBase::leave_to_issuer(ctx);
}

void ShmProcessGroup::arrive(const Pending& p) {
  const int n = size();
  Slot* s = slot(p.ticket);
  Arrival* mine = arrival(s, rank());
  mine->region = p.region ? p.region->id : 0;
  mine->offset = p.offset;
  mine->count = p.count;
  mine->dtype = static_cast<uint32_t>(p.dtype);
  mine->op = static_cast<uint32_t>(p.op);
  mine->kind = static_cast<uint32_t>(p.kind);
  if (s->arrivals.fetch_add(1, std::memory_order_acq_rel) + 1 != static_cast<uint32_t>(n)) return;
  // Last to arrive: in place only when every rank's buffer lies in the same allocation (and
  // they agree on the operation), else every rank stages.
  bool same = p.region != nullptr;
  const size_t es = dtype_size(p.dtype);
  for (int q = 0; q < n && same; ++q) {
    const Arrival* a = arrival(s, q);
    same = a->region == mine->region && a->count == p.count && a->dtype == mine->dtype &&
           a->op == mine->op && a->kind == mine->kind &&
           a->offset + p.count * es <= p.region->maps[q].size();
  }
  s->verdict.store(same ? 1 : 2, std::memory_order_release);
  signal();
}

bool ShmProcessGroup::enter_in_place(OpContext& ctx, Pending& p, std::vector<uint8_t*>& base) {
  {
    std::lock_guard<std::mutex> lock(pending_mu_);
    MT_CHECK(!pending_.empty() && pending_.front().ticket == static_cast<uint64_t>(ctx.ticket),
             "in-place collectives ran out of issue order");
    p = std::move(pending_.front());
    pending_.pop_front();
  }
  const int n = size();
  Slot* s = slot(p.ticket);
  const uint64_t round = p.ticket / kSlots;
  std::vector<int> others;
  for (int q = 0; q < n; ++q) {
    if (q != rank()) others.push_back(q);
  }
  if (!p.arrived) {
    wait_until(
        ctx, &header_->signal,
        [&] { return s->open_round.load(std::memory_order_acquire) == round; }, others,
        "in-place collective: an earlier one still running");
    arrive(p);
  }
  wait_until(
      ctx, &header_->signal, [&] { return s->verdict.load(std::memory_order_acquire) != 0; },
      others, "in-place collective: buffers not announced");
  const bool in_place = s->verdict.load(std::memory_order_acquire) == 1;
  base.assign(static_cast<size_t>(n), nullptr);
  if (in_place)
    for (int q = 0; q < n; ++q) base[q] = p.region->maps[q].data() + arrival(s, q)->offset;
  return in_place;
}

void ShmProcessGroup::wait_in_place_done(OpContext& ctx, const Pending& p, uint32_t need,
                                         const char* what) {
  Slot* s = slot(p.ticket);
  std::vector<int> others;
  for (int q = 0; q < size(); ++q) {
    if (q != rank()) others.push_back(q);
  }
  wait_until(
      ctx, &header_->signal, [&] { return s->chunks_done.load(std::memory_order_acquire) >= need; },
      others, what);
}

void ShmProcessGroup::leave_in_place(const Pending& p) {
  Slot* s = slot(p.ticket);
  const uint64_t round = p.ticket / kSlots;
  if (s->left.fetch_add(1, std::memory_order_acq_rel) + 1 == static_cast<uint32_t>(size())) {
    s->arrivals.store(0, std::memory_order_relaxed);
    s->verdict.store(0, std::memory_order_relaxed);
    s->next_chunk.store(0, std::memory_order_relaxed);
    s->chunks_done.store(0, std::memory_order_relaxed);
    s->left.store(0, std::memory_order_relaxed);
    s->open_round.store(round + 1, std::memory_order_release);
    signal();
  }
}

bool ShmProcessGroup::all_reduce_in_place(OpContext& ctx, void* data, size_t count, DType dtype,
                                          ReduceOp op) {
  Pending p;
  std::vector<uint8_t*> base;
  const bool in_place = enter_in_place(ctx, p, base);
  if (in_place) {
    // Every rank's buffer is ready (announced), and stays untouched by its owner until that rank
    // has seen every chunk done. A chunk's claimer reduces it from all buffers in rank order
    // (the same bits as the staged path) into its own buffer and copies the result into the
    // others'. Ranks that wait for a peer still in backward thus do the work meanwhile.
    const int n = size();
    Slot* s = slot(p.ticket);
    const size_t es = dtype_size(dtype);
    auto* mine = static_cast<uint8_t*>(data);
    const size_t chunk = std::max<size_t>(1, shared_chunk_bytes_ / es);
    const auto chunks = static_cast<uint32_t>((count + chunk - 1) / chunk);
    std::vector<const void*> srcs(n);
    for (;;) {
      const uint32_t c = s->next_chunk.fetch_add(1, std::memory_order_relaxed);
      if (c >= chunks) break;
      const size_t lo = c * chunk, len = std::min(chunk, count - lo);
      for (int q = 0; q < n; ++q) srcs[q] = base[q] + lo * es;
      reduce_sources(mine + lo * es, srcs.data(), n, len, dtype, op, n);
      for (int q = 0; q < n; ++q) {
        if (q != rank()) std::memcpy(base[q] + lo * es, mine + lo * es, len * es);
      }
      in_place_chunks_.fetch_add(1, std::memory_order_relaxed);
      if (s->chunks_done.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) signal();
    }
    wait_in_place_done(ctx, p, chunks, "in-place all-reduce: chunks claimed by peers");
  }
  leave_in_place(p);
  if (in_place) in_place_all_reduces_.fetch_add(1, std::memory_order_relaxed);
  return in_place;
}

bool ShmProcessGroup::run_in_place_part(
    OpContext& ctx, const char* what,
    const std::function<void(const std::vector<uint8_t*>&)>& part) {
  Pending p;
  std::vector<uint8_t*> base;
  const bool in_place = enter_in_place(ctx, p, base);
  if (in_place) {
    part(base);
    // The buffers stay untouched by their owners until every rank has done its part.
    const auto n = static_cast<uint32_t>(size());
    if (slot(p.ticket)->chunks_done.fetch_add(1, std::memory_order_acq_rel) + 1 == n) signal();
    wait_in_place_done(ctx, p, n, what);
  }
  leave_in_place(p);
  return in_place;
}

bool ShmProcessGroup::reduce_scatter_in_place(OpContext& ctx, void* output, size_t count,
                                              DType dtype, ReduceOp op) {
  // This rank's block, reduced from every rank's input in rank order (the all-reduce's bits)
  // straight into the output.
  const bool done = run_in_place_part(ctx, "in-place reduce-scatter: peers still reading",
                                      [&](const std::vector<uint8_t*>& base) {
                                        const int n = size();
                                        const size_t es = dtype_size(dtype);
                                        std::vector<const void*> srcs(n);
                                        for (int q = 0; q < n; ++q)
                                          srcs[q] = base[q] + rank() * count * es;
                                        reduce_sources(output, srcs.data(), n, count, dtype, op, n);
                                      });
  if (done) in_place_reduce_scatters_.fetch_add(1, std::memory_order_relaxed);
  return done;
}

bool ShmProcessGroup::all_gather_in_place(OpContext& ctx, void* output, size_t count, DType dtype) {
  // Every rank's block is in its own output already: copy the peers' blocks from theirs.
  const bool done = run_in_place_part(
      ctx, "in-place all-gather: peers still reading", [&](const std::vector<uint8_t*>& base) {
        const size_t es = dtype_size(dtype);
        auto* out = static_cast<uint8_t*>(output);
        for (int q = 0; q < size(); ++q)
          if (q != rank()) std::memcpy(out + q * count * es, base[q] + q * count * es, count * es);
      });
  if (done) in_place_all_gathers_.fetch_add(1, std::memory_order_relaxed);
  return done;
}

void ShmProcessGroup::run_all_reduce(OpContext& ctx, void* data, size_t count, DType dtype,
                                     ReduceOp op) {
  reduce_chunks(ctx, data, count, dtype, op, -1);
}

void ShmProcessGroup::run_reduce(OpContext& ctx, void* data, size_t count, DType dtype, ReduceOp op,
                                 int root) {
  reduce_chunks(ctx, data, count, dtype, op, root);
}

void ShmProcessGroup::run_broadcast(OpContext& ctx, void* data, size_t count, DType dtype,
                                    int root) {
  begin_op(ctx);
  const size_t es = dtype_size(dtype);
  const size_t chunk_elems = chunk_bytes_ / es;
  auto* bytes = static_cast<uint8_t*>(data);
  for (size_t off = 0; off < count; off += chunk_elems) {
    const size_t m = std::min(chunk_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    if (rank() == root) std::memcpy(buffer(root, parity), bytes + off * es, m * es);
    meet(ctx);
    if (rank() != root) std::memcpy(bytes + off * es, buffer(root, parity), m * es);
  }
}

void ShmProcessGroup::all_gather_chunks(OpContext& ctx, const void* input, void* output,
                                        const std::vector<size_t>& counts, DType dtype, int root) {
  begin_op(ctx);
  const int n = size();
  const size_t es = dtype_size(dtype);
  const size_t chunk_elems = chunk_bytes_ / es;
  std::vector<size_t> displs(n, 0);
  size_t max_count = 0;
  for (int q = 0; q < n; ++q) {
    if (q > 0) displs[q] = displs[q - 1] + counts[q - 1];
    max_count = std::max(max_count, counts[q]);
  }
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (size_t off = 0; off < max_count; off += chunk_elems) {
    const uint64_t parity = chunk_counter_++;
    auto part = [&](int q) { return counts[q] > off ? std::min(chunk_elems, counts[q] - off) : 0; };
    if (size_t m = part(rank()); m > 0) std::memcpy(buffer(rank(), parity), in + off * es, m * es);
    meet(ctx);
    if (root >= 0 && root != rank()) continue;
    for (int q = 0; q < n; ++q) {
      if (size_t m = part(q); m > 0) {
        const uint8_t* src = q == rank() ? in + off * es : buffer(q, parity);
        std::memcpy(out + (displs[q] + off) * es, src, m * es);
      }
    }
  }
}

void ShmProcessGroup::run_all_gather_v(OpContext& ctx, const void* input, void* output,
                                       const std::vector<size_t>& counts, DType dtype) {
  // A ticket only comes with the equal-count all_gather.
  if (ctx.ticket >= 0) {
    begin_op(ctx);
    if (all_gather_in_place(ctx, output, counts[0], dtype)) return;
  }
  all_gather_chunks(ctx, input, output, counts, dtype, -1);
}

void ShmProcessGroup::run_gather(OpContext& ctx, const void* input, void* output, size_t count,
                                 DType dtype, int root) {
  all_gather_chunks(ctx, input, output, std::vector<size_t>(size(), count), dtype, root);
}

void ShmProcessGroup::run_scatter(OpContext& ctx, const void* input, void* output, size_t count,
                                  DType dtype, int root) {
  begin_op(ctx);
  const int n = size();
  const size_t es = dtype_size(dtype);
  const size_t chunk_elems = chunk_bytes_ / es;
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (size_t off = 0; off < count; off += chunk_elems) {
    const size_t m = std::min(chunk_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    if (rank() == root) {
      for (int q = 0; q < n; ++q) {
        if (q != root) std::memcpy(buffer(q, parity), in + (q * count + off) * es, m * es);
      }
      std::memcpy(out + off * es, in + (root * count + off) * es, m * es);
    }
    meet(ctx);
    if (rank() != root) std::memcpy(out + off * es, buffer(rank(), parity), m * es);
  }
}

void ShmProcessGroup::run_reduce_scatter(OpContext& ctx, const void* input, void* output,
                                         size_t count, DType dtype, ReduceOp op) {
  begin_op(ctx);
  if (ctx.ticket >= 0 && reduce_scatter_in_place(ctx, output, count, dtype, op)) return;
  const int n = size();
  const size_t es = dtype_size(dtype);
  // Each staging buffer holds one piece of every destination block.
  const size_t piece_elems = std::max<size_t>(1, (chunk_bytes_ / n) / es);
  const size_t piece_bytes = round_up(piece_elems * es, 1);
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  std::vector<const void*> srcs(n);
  for (size_t off = 0; off < count; off += piece_elems) {
    const size_t m = std::min(piece_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    uint8_t* mine = buffer(rank(), parity);
    for (int q = 0; q < n; ++q) {
      std::memcpy(mine + q * piece_bytes, in + (q * count + off) * es, m * es);
    }
    meet(ctx);
    for (int s = 0; s < n; ++s) srcs[s] = buffer(s, parity) + rank() * piece_bytes;
    reduce_sources(out + off * es, srcs.data(), n, m, dtype, op, n);
  }
}

void ShmProcessGroup::run_all_to_all(OpContext& ctx, const void* input, void* output, size_t count,
                                     DType dtype) {
  begin_op(ctx);
  const int n = size();
  const size_t es = dtype_size(dtype);
  const size_t piece_elems = std::max<size_t>(1, (chunk_bytes_ / n) / es);
  const size_t piece_bytes = piece_elems * es;
  const auto* in = static_cast<const uint8_t*>(input);
  auto* out = static_cast<uint8_t*>(output);
  for (size_t off = 0; off < count; off += piece_elems) {
    const size_t m = std::min(piece_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    uint8_t* mine = buffer(rank(), parity);
    for (int q = 0; q < n; ++q) {
      std::memcpy(mine + q * piece_bytes, in + (q * count + off) * es, m * es);
    }
    meet(ctx);
    for (int s = 0; s < n; ++s) {
      std::memcpy(out + (s * count + off) * es, buffer(s, parity) + rank() * piece_bytes, m * es);
    }
  }
}

void ShmProcessGroup::run_barrier(OpContext& ctx) {
  begin_op(ctx);
  meet(ctx);
}

}  // namespace meshtrain::comm
