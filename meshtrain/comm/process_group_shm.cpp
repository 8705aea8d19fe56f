// ShmProcessGroup: the segment (made, laid out, fitted to /dev/shm, mapped by every rank), the
// buffers of allocate_buffer, and aborting. Tuning, waiting, the staged collectives and the
// in-place protocol are in the process_group_shm_*.cpp files beside this one.
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

#include "meshtrain/comm/process_group_shm_layout.h"
#include "meshtrain/comm/process_group_shm_tuning.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::comm {

using namespace shm_internal;

namespace {

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

std::string random_suffix() {
  std::random_device rd;
  std::ostringstream os;
  os << std::hex << ::getpid() << '-' << rd() << rd();
  return os.str();
}

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
  check_shm_overrides();
  const int n = size;
  chunk_bytes_ = round_up(std::max<size_t>(options().shm_chunk_bytes, kLine * n), kLine);
  channel_bytes_ = n <= 16 ? (size_t{256} << 10) : (size_t{64} << 10);
  // The job's first group fixes the host-wide budget; a split inherits its share from its parent.
  ShmBudget& budget = mutable_shm_budget();
  const bool root = budget.host_ranks == 0;
  if (root) budget.host_ranks = n;
  const std::string key = key_prefix() + "shm/segment";
  if (rank == 0) {
    segment_name_ = "/meshtrain-" + random_suffix();
    auto fail = [&](const std::string& what) {
      this->store()->set_string(key, "!" + what);  // the other ranks fail with the same line
      MT_THROW(CommError, what);
    };
    // A container's /dev/shm is 64 MiB by default: 8 ranks' segment (80 MiB) would not fit.
    if (const std::optional<DevShmSpace> space = dev_shm_space()) {
      if (root) {
        budget = root_shm_budget(budget, space->free_bytes, n);
        // Every planned group at its smallest must fit, else the job stops here, on every rank
        // of this group, instead of one split failing while the others wait for it.
        const uint64_t need = smallest_segments(n, budget.planned_groups);
        if (need > space->free_bytes) {
          fail(detail::str_cat(
              "the shm groups of this job (", n, " ranks and ", budget.planned_groups.size(),
              " groups split off them) need at least ", format_mib(need),
              " of shared memory, but /dev/shm has ", format_mib(space->free_bytes),
              " free; give the job a larger /dev/shm (docker run --shm-size, a "
              "memory-backed emptyDir in Kubernetes) or use the tcp backend"));
        }
      }
      fit_segment_to_dev_shm(space->free_bytes);
    }
    const size_t total = lay_out_segment();
    try {
      // Every page is reserved now: a /dev/shm too small even for the smallest segment fails
      // here, on every rank, with an error instead of a SIGBUS in the middle of a collective.
      segment_ = ShmSegment::create(segment_name_, total, /*reserve=*/true);
    } catch (const CommError& e) {
      fail(detail::str_cat("the shm process group of ", n, " ranks cannot be made: ", e.what(),
                           "; give the job a larger /dev/shm (docker run --shm-size, a "
                           "memory-backed emptyDir in Kubernetes) or use the tcp backend"));
    }
    auto* h = reinterpret_cast<Header*>(segment_.data());
    h->size = static_cast<uint32_t>(n);
    h->chunk_bytes = chunk_bytes_;
    h->channel_bytes = channel_bytes_;
    h->magic.store(kMagic, std::memory_order_release);
    this->store()->set_string(
        key, detail::str_cat(segment_name_, " ", chunk_bytes_, " ", channel_bytes_, " ",
                             budget.job_bytes, " ", budget.total_weight));
  } else {
    const std::string value = this->store()->get_string(key);
    if (!value.empty() && value[0] == '!') MT_THROW(CommError, "rank 0: ", value.substr(1));
    std::istringstream in(value);
    uint64_t job_bytes = 0;
    int total_weight = 0;
    in >> segment_name_ >> chunk_bytes_ >> channel_bytes_ >> job_bytes >> total_weight;
    MT_CHECK(!in.fail() && !segment_name_.empty() && segment_name_[0] == '/' &&
                 segment_name_.size() < 200 && chunk_bytes_ >= kLine * n && channel_bytes_ > 0,
             "bad shm segment description in the store: '", value, "'");
    // Rank 0's budget, so that every rank gives its splits the same shares.
    budget.job_bytes = job_bytes;
    budget.total_weight = total_weight;
    if (root) budget.weight = n;
    segment_ = ShmSegment::open(segment_name_, lay_out_segment());
  }
  {
    // This rank's own cores until every rank has said which it may use.
    const ShmCoreShare share = shm_core_share(n, usable_cpus(), budget);
    tune(share.ranks, share.cpus);
  }
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
  if (group_cpus > 0) {
    // The job's first group knows the host's cores; its splits judge by them (their ranks
    // compete with the ranks of every other group of the job).
    if (root) budget.host_cpus = group_cpus;
    const ShmCoreShare share = shm_core_share(n, group_cpus, budget);
    tune(share.ranks, share.cpus);
  }
}

size_t ShmProcessGroup::blocks_offset() {
  return round_up(sizeof(Header), kLine);
}

size_t ShmProcessGroup::segment_bytes_for(int ranks, size_t chunk_bytes, size_t channel_bytes) {
  const size_t n = static_cast<size_t>(ranks);
  size_t offset = blocks_offset() + sizeof(RankBlock) * n;
  offset += (sizeof(Slot) + sizeof(Arrival) * n) * kSlots;
  offset = round_up(offset, 4096) + chunk_bytes * 2 * n;
  return round_up(offset, 4096) + ShmTransport::stride_for(channel_bytes) * n * n;
}

size_t ShmProcessGroup::smallest_segment_bytes(int ranks) {
  return segment_bytes_for(ranks, min_chunk_bytes(ranks), kMinChannelBytes);
}

size_t ShmProcessGroup::min_chunk_bytes(int ranks) {
  return round_up(std::max<size_t>(size_t{256} << 10, kLine * static_cast<size_t>(ranks)), kLine);
}

uint64_t ShmProcessGroup::smallest_segments(int ranks, const std::vector<int>& planned) {
  uint64_t need = smallest_segment_bytes(ranks);
  for (int m : planned) need += m > 1 ? smallest_segment_bytes(m) : 0;
  return need;
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
  const size_t total = channels_offset_ + channel_stride_ * n * n;
  MT_CHECK(total == segment_bytes_for(size(), chunk_bytes_, channel_bytes_),
           "shm segment layout and its size disagree");
  return total;
}

void ShmProcessGroup::fit_segment_to_dev_shm(uint64_t free_bytes) {
  const ShmBudget& budget = shm_budget();
  // The group's share of the job's budget; without one (a group alone, a split the plan does
  // not list) half of what is free, the rest being for buffers from allocate_buffer.
  const uint64_t share = budget.share_bytes();
  const uint64_t target = share > 0 ? share : free_bytes / 2;
  const size_t chunk = chunk_bytes_, channel = channel_bytes_;
  const int n = size();
  const ShmSegmentFit fit =
      fit_shm_segment(chunk_bytes_, channel_bytes_, min_chunk_bytes(n), kMinChannelBytes, target,
                      [n](size_t c, size_t ch) { return segment_bytes_for(n, c, ch); });
  chunk_bytes_ = fit.chunk_bytes;
  channel_bytes_ = fit.channel_bytes;
  const std::string whose =
      share > 0 ? detail::str_cat("its share (", budget.weight, "/", budget.total_weight,
                                  ") of the job's ", format_mib(budget.job_bytes),
                                  " of /dev/shm is ", format_mib(share))
                : detail::str_cat("/dev/shm has ", format_mib(free_bytes), " free");
  if (chunk_bytes_ != chunk || channel_bytes_ != channel) {
    const std::string line = detail::str_cat(
        "shm group of ", n, " ranks: ", whose, ", so its staging buffers are cut from ",
        chunk >> 10, " to ", chunk_bytes_ >> 10, " KiB and its channels from ", channel >> 10,
        " to ", channel_bytes_ >> 10, " KiB (", format_mib(fit.segment_bytes),
        " in all; collectives on private buffers get slower); a larger /dev/shm "
        "(docker run --shm-size) restores them");
    // A group split off the job's first one was planned for: the first group's warning (one per
    // job, not one per group of a mesh) has said that /dev/shm is small.
    const bool planned_split =
        share > 0 && budget.planned_groups.empty() && budget.weight < budget.total_weight;
    if (planned_split) {
      MT_LOG_INFO("comm", line);
    } else {
      MT_LOG_WARN("comm", line);
    }
  } else if (share > 0) {
    MT_LOG_DEBUG("comm", "shm group of ", n, " ranks: ", whose, "; its segment takes ",
                 format_mib(fit.segment_bytes));
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

std::string ShmProcessGroup::algorithm_label(const OpContext& ctx) const {
  (void)ctx;
  return "shm-slots";
}

}  // namespace meshtrain::comm
