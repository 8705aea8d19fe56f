// ShmProcessGroup: segment layout, rendezvous, barrier, chunked collectives, pair rings.
#include "meshtrain/comm/process_group_shm.h"

#include <immintrin.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <sstream>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

constexpr uint64_t kMagic = 0x6d7473686d763032ull;  // "mtshmv02"
constexpr size_t kLine = 64;
// Waiting: spin on the word while every rank has a core of its own (a peer is running and will
// be there in well under a microsecond), then give the core away with sched_yield (with more
// ranks than cores the peer we wait for is often queued behind us on this very core), and only
// then sleep on the futex, which costs a system call and a wake-up on both sides.
constexpr auto kSpinFor = std::chrono::microseconds(20);
constexpr int kOversubscribedSpins = 64;
constexpr auto kYieldFor = std::chrono::microseconds(300);
constexpr auto kSleepSlice = std::chrono::milliseconds(20);
// An all-reduce moves through the staging buffers in steps this large (per rank), so that a
// step's data is still in cache when it is reduced and copied out. MESHTRAIN_SHM_STEP_BYTES
// overrides it for tuning.
constexpr size_t kDefaultStepBytes = size_t{128} << 10;
// Steps up to this size (and every step with two ranks) are reduced whole by every rank, in rank
// order, straight into its output: one meeting per step instead of two. Reducing 1/N each and
// copying the slices out gives the same bits, since both combine in rank order.
constexpr size_t kWholeReduceBytes = size_t{32} << 10;

size_t env_bytes(const char* name, size_t fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  unsigned long long x = std::strtoull(v, &end, 10);
  return end != v && x > 0 ? static_cast<size_t>(x) : fallback;
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
  alignas(kLine) std::atomic<uint32_t> sleepers;  // ranks asleep on epoch: wake only if any
};

struct alignas(kLine) ShmProcessGroup::RankBlock {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> arrived;   // last barrier this rank arrived at (low 32 bits)
  std::atomic<uint64_t> seq;       // the operation it runs (+1; 0 = none yet)
  std::atomic<uint32_t> doorbell;  // rung by peers that touched a ring shared with this rank
};

ShmProcessGroup::ShmProcessGroup(std::shared_ptr<Store> store, int rank, int size,
                                 ProcessGroupOptions opts)
    : ProcessGroupBase(std::move(store), rank, size, std::move(opts), "shm") {
  const int n = size;
  chunk_bytes_ = round_up(std::max<size_t>(options().shm_chunk_bytes, kLine * n), kLine);
  channel_bytes_ = n <= 16 ? (size_t{256} << 10) : (size_t{64} << 10);
  step_bytes_ = std::min(chunk_bytes_,
                         round_up(env_bytes("MESHTRAIN_SHM_STEP_BYTES", kDefaultStepBytes), kLine));
  whole_bytes_ = env_bytes("MESHTRAIN_SHM_WHOLE_BYTES", kWholeReduceBytes);
  oversubscribed_ = n > usable_cpus();
  size_t offset = round_up(sizeof(Header), kLine);
  size_t blocks_offset = offset;
  offset += sizeof(RankBlock) * n;
  buffers_offset_ = round_up(offset, 4096);
  offset = buffers_offset_ + chunk_bytes_ * 2 * n;
  channels_offset_ = round_up(offset, 4096);
  size_t channel_stride = ShmTransport::stride_for(channel_bytes_);
  size_t total = channels_offset_ + channel_stride * n * n;

  const std::string key = key_prefix() + "shm/segment";
  if (rank == 0) {
    segment_name_ = "/meshtrain-" + random_suffix();
    segment_ = ShmSegment::create(segment_name_, total);
    auto* h = reinterpret_cast<Header*>(segment_.data());
    h->size = static_cast<uint32_t>(n);
    h->chunk_bytes = chunk_bytes_;
    h->channel_bytes = channel_bytes_;
    h->magic.store(kMagic, std::memory_order_release);
    this->store()->set_string(key, segment_name_);
  } else {
    segment_name_ = this->store()->get_string(key);
    MT_CHECK(!segment_name_.empty() && segment_name_[0] == '/' && segment_name_.size() < 200,
             "bad shm segment name in store");
    segment_ = ShmSegment::open(segment_name_, total);
  }
  header_ = reinterpret_cast<Header*>(segment_.data());
  blocks_ = reinterpret_cast<RankBlock*>(segment_.data() + blocks_offset);
  if (header_->magic.load(std::memory_order_acquire) != kMagic || header_->size != uint32_t(n) ||
      header_->chunk_bytes != chunk_bytes_ || header_->channel_bytes != channel_bytes_) {
    MT_THROW(CommError, "shm segment ", segment_name_,
             " does not match this group (size or options differ between ranks)");
  }
  blocks_[rank].pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
  // The last rank to map the segment removes its name: nothing is left behind in /dev/shm
  // even when the job is killed later.
  if (header_->mapped.fetch_add(1, std::memory_order_acq_rel) + 1 == uint32_t(n)) {
    ShmSegment::unlink(segment_name_);
  }
  ShmTransportLayout layout;
  layout.rings = segment_.data() + channels_offset_;
  layout.ring_stride = channel_stride;
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
}

ShmProcessGroup::~ShmProcessGroup() {
  stop();
  transport_.reset();
}

uint8_t* ShmProcessGroup::buffer(int rank, uint64_t parity) const {
  return segment_.data() + buffers_offset_ + chunk_bytes_ * (2 * rank + (parity & 1));
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
    const auto spin_until = std::chrono::steady_clock::now() + kSpinFor;
    for (int i = 0;; ++i) {
      if (ready()) return;
      _mm_pause();
      if ((i & 255) == 255 && std::chrono::steady_clock::now() >= spin_until) break;
    }
  }
  auto last_check = std::chrono::steady_clock::now();
  const auto yield_until = last_check + kYieldFor;
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
  const size_t es = dtype_size(dtype);
  const size_t step_elems = std::max<size_t>(1, step_bytes_ / es);
  const size_t align_elems = std::max<size_t>(1, kLine / es);
  auto* bytes = static_cast<uint8_t*>(data);
  std::vector<const void*> srcs(n);
  for (size_t off = 0; off < count; off += step_elems) {
    const size_t m = std::min(step_elems, count - off);
    const uint64_t parity = chunk_counter_++;
    // Copy in and reduce right away, while the step is still in cache.
    std::memcpy(buffer(rank(), parity), bytes + off * es, m * es);
    meet(ctx);
    if (n <= 2 || m * es <= whole_bytes_) {
      if (root < 0 || root == rank()) {
        for (int q = 0; q < n; ++q) srcs[q] = buffer(q, parity);
        reduce_sources(bytes + off * es, srcs.data(), n, m, dtype, op, n);
      }
      continue;
    }
    // Slices are cache-line aligned so that ranks never write the same line.
    const size_t per = round_up((m + n - 1) / n, align_elems);
    auto slice = [&](int q) {
      size_t lo = std::min(m, per * q);
      return std::pair<size_t, size_t>(lo, std::min(m, lo + per));
    };
    auto [lo, hi] = slice(rank());
    if (hi > lo) {
      for (int q = 0; q < n; ++q) srcs[q] = buffer(q, parity) + lo * es;
      reduce_sources(buffer(rank(), parity) + lo * es, srcs.data(), n, hi - lo, dtype, op, n);
    }
    meet(ctx);
    if (root < 0 || root == rank()) {
      for (int q = 0; q < n; ++q) {
        auto [qlo, qhi] = slice(q);
        if (qhi > qlo) {
          std::memcpy(bytes + (off + qlo) * es, buffer(q, parity) + qlo * es, (qhi - qlo) * es);
        }
      }
    }
  }
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
