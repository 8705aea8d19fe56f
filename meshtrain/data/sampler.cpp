// Sampler: a Fisher-Yates shuffle driven by splitmix64 draws keyed on (seed, epoch), then a
// strided split across replicas.
#include "meshtrain/data/sampler.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "meshtrain/util/error.h"
#include "meshtrain/util/splitmix64.h"

namespace meshtrain::data {

nlohmann::json SamplerState::to_json() const {
  return {{"epoch", epoch}, {"offset", offset}};
}

SamplerState SamplerState::from_json(const nlohmann::json& j) {
  if (!j.is_object() || !j.contains("epoch") || !j.contains("offset") ||
      !j["epoch"].is_number_integer() || !j["offset"].is_number_integer()) {
    MT_THROW(ValueError, "sampler state must be {\"epoch\": int, \"offset\": int}, got ", j.dump());
  }
  SamplerState s{j["epoch"].get<int64_t>(), j["offset"].get<int64_t>()};
  if (s.epoch < 0 || s.offset < 0) MT_THROW(ValueError, "negative sampler state ", j.dump());
  return s;
}

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle) {
  MT_CHECK(n >= 0, "negative dataset size ", n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (!shuffle) return perm;
  const uint64_t key = splitmix64_key(seed, static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    auto j = static_cast<int64_t>(
        bounded(splitmix64_at(key, static_cast<uint64_t>(i)), static_cast<uint64_t>(i + 1)));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

namespace {

// The shard order's own stream, apart from the windows' (seed, epoch) draws.
constexpr uint64_t kShardOrderStream = 0x534841524453ull;

// One epoch's shards in the order they are visited, and where each block of them ends.
struct ShardBlocks {
  std::vector<int64_t> shards;
  std::vector<size_t> end;  // end[k]: index into shards one past block k
};

ShardBlocks shard_blocks(const SamplerOptions& o, int64_t epoch) {
  const auto count = static_cast<int64_t>(o.shard_ends.size());
  ShardBlocks b;
  const bool in_blocks = o.shuffle && o.shard_block > 0;
  b.shards = epoch_permutation(count, splitmix64_key(o.seed, kShardOrderStream), epoch, in_blocks);
  const int64_t per_block = !o.shuffle  ? 1
                            : in_blocks ? o.shard_block
                                        : std::max<int64_t>(count, 1);
  for (int64_t e = per_block; e < count + per_block; e += per_block)
    b.end.push_back(static_cast<size_t>(std::min(e, count)));
  return b;
}

int64_t shard_begin(const SamplerOptions& o, int64_t shard) {
  return shard == 0 ? 0 : o.shard_ends[static_cast<size_t>(shard - 1)];
}

}  // namespace

std::vector<int64_t> epoch_order(const SamplerOptions& o, int64_t epoch) {
  if (!o.shuffle || o.shard_block <= 0 || o.shard_ends.empty())
    return epoch_permutation(o.num_windows, o.seed, epoch, o.shuffle);
  const ShardBlocks b = shard_blocks(o, epoch);
  std::vector<int64_t> order;
  order.reserve(static_cast<size_t>(o.num_windows));
  const uint64_t block_seed = splitmix64_key(o.seed, static_cast<uint64_t>(epoch));
  size_t first = 0;
  std::vector<int64_t> windows;
  for (size_t k = 0; k < b.end.size(); ++k) {
    windows.clear();
    for (size_t i = first; i < b.end[k]; ++i) {
      const int64_t s = b.shards[i];
      for (int64_t w = shard_begin(o, s); w < o.shard_ends[static_cast<size_t>(s)]; ++w)
        windows.push_back(w);
    }
    const auto n = static_cast<int64_t>(windows.size());
    for (const int64_t j : epoch_permutation(n, block_seed, static_cast<int64_t>(k), true))
      order.push_back(windows[static_cast<size_t>(j)]);
    first = b.end[k];
  }
  return order;
}

Sampler::Sampler(const SamplerOptions& options) : options_(options) {
  MT_CHECK(options_.num_windows > 0, "sampler over an empty dataset");
  if (options_.num_replicas < 1 || options_.rank < 0 || options_.rank >= options_.num_replicas) {
    MT_THROW(ValueError, "sampler: rank ", options_.rank, " is not in [0, ", options_.num_replicas,
             ")");
  }
  MT_CHECK(options_.shard_ends.empty() || options_.shard_ends.back() == options_.num_windows,
           "sampler: the shards hold ",
           options_.shard_ends.empty() ? 0 : options_.shard_ends.back(), " windows, not ",
           options_.num_windows);
  if (options_.shard_block < 0)
    MT_THROW(ValueError, "sampler: shard_block must be >= 0, got ", options_.shard_block);
  const int64_t n = options_.num_windows;
  const int64_t r = options_.num_replicas;
  per_rank_ = options_.drop_last ? n / r : (n + r - 1) / r;
  if (per_rank_ == 0) {
    MT_THROW(ValueError, "sampler: ", n, " windows cannot feed ", r,
             " replicas with drop_last; each rank would get none");
  }
}

std::vector<int64_t> Sampler::epoch_indices(int64_t epoch) const {
  MT_CHECK(epoch >= 0, "negative epoch ", epoch);
  const int64_t n = options_.num_windows;
  const int64_t r = options_.num_replicas;
  std::vector<int64_t> perm = epoch_order(options_, epoch);
  std::vector<int64_t> mine(static_cast<size_t>(per_rank_));
  for (int64_t k = 0; k < per_rank_; ++k) {
    int64_t pos = options_.rank + k * r;  // < per_rank_ * r, which is <= n + r - 1
    mine[static_cast<size_t>(k)] = perm[static_cast<size_t>(pos % n)];
  }
  return mine;
}

const std::vector<int64_t>& Sampler::permutation(int64_t epoch) {
  const size_t slot = static_cast<size_t>(epoch % 2);
  if (cached_for_[slot] != epoch) {
    cache_[slot] = epoch_order(options_, epoch);
    cached_for_[slot] = epoch;
  }
  return cache_[slot];
}

std::vector<int64_t> Sampler::next(int64_t n) {
  std::vector<int64_t> epochs;
  return next(n, epochs);
}

std::vector<int64_t> Sampler::next(int64_t n, std::vector<int64_t>& epochs) {
  MT_CHECK(n >= 0, "negative sample count ", n);
  epochs.clear();
  epochs.reserve(static_cast<size_t>(n));
  const int64_t length = epoch_length();
  const int64_t r = options_.num_replicas;
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) {
    // After a resume at an offset not divisible by R, this rank's next position may already
    // lie in the next epoch while other ranks finish the current one.
    int64_t epoch = epoch_;
    int64_t pos = offset_ + options_.rank;
    if (pos >= length) {
      pos -= length;
      ++epoch;
    }
    const std::vector<int64_t>& perm = permutation(epoch);
    out.push_back(perm[static_cast<size_t>(pos % options_.num_windows)]);  // pos % n: padding
    epochs.push_back(epoch);
    offset_ += r;
    if (offset_ >= length) {
      offset_ -= length;
      ++epoch_;
    }
  }
  return out;
}

std::vector<int64_t> Sampler::upcoming_shards(int64_t ahead) const {
  if (options_.shard_ends.empty()) return {};
  const int64_t length = epoch_length();
  int64_t epoch = epoch_;
  int64_t pos = offset_ + options_.rank;
  if (pos >= length) {
    pos -= length;
    ++epoch;
  }
  pos %= options_.num_windows;  // the padded tail reads the epoch's first windows
  const size_t count = options_.shard_ends.size();
  std::vector<int64_t> out;
  std::vector<bool> taken(count, false);
  auto take = [&](int64_t s) {
    if (taken[static_cast<size_t>(s)]) return false;
    taken[static_cast<size_t>(s)] = true;
    out.push_back(s);
    return true;
  };
  ShardBlocks b = shard_blocks(options_, epoch);
  // The block holding position `pos`: blocks cover the epoch's positions in order.
  size_t block = 0, first = 0;
  for (int64_t covered = 0; block < b.end.size(); ++block) {
    for (size_t i = first; i < b.end[block]; ++i) {
      const int64_t s = b.shards[i];
      covered += options_.shard_ends[static_cast<size_t>(s)] - shard_begin(options_, s);
    }
    if (pos < covered) break;
    first = b.end[block];
  }
  const size_t block_end = b.end[std::min(block, b.end.size() - 1)];
  for (size_t i = first; i < block_end; ++i) take(b.shards[i]);
  int64_t more = 0;
  for (size_t i = block_end; more < ahead && i < count; ++i) more += take(b.shards[i]) ? 1 : 0;
  if (more < ahead && out.size() < count) {
    b = shard_blocks(options_, epoch + 1);
    for (size_t i = 0; more < ahead && i < count; ++i) more += take(b.shards[i]) ? 1 : 0;
  }
  return out;
}

SamplerState Sampler::state() const {
  return {epoch_, offset_};
}

void Sampler::set_state(const SamplerState& state) {
  const int64_t n = options_.num_windows;
  if (state.epoch < 0 || state.offset < 0 || state.offset >= 2 * n + options_.num_replicas) {
    MT_THROW(ValueError, "sampler state (epoch ", state.epoch, ", offset ", state.offset,
             ") does not fit this sampler (", n, " windows, ", options_.num_replicas, " replicas, ",
             epoch_length(), " positions per epoch)");
  }
  epoch_ = state.epoch;
  offset_ = state.offset;
  if (offset_ >= epoch_length()) {
    ++epoch_;
    offset_ = 0;
  }
}

}  // namespace meshtrain::data
