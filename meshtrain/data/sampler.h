// The order in which training visits dataset windows. One class covers the three cases:
//   - random (num_replicas = 1): a fresh permutation every epoch,
//   - sequential (shuffle = false): 0, 1, 2, ... for evaluation,
//   - distributed (num_replicas = R): every rank computes the same epoch permutation and takes
//     positions rank, rank + R, rank + 2R, ... so ranks never overlap and together cover the
//     dataset once per epoch (padded by wrapping around, or cut with drop_last).
// Each epoch's permutation is a pure function of (seed, epoch) through a counter-based RNG
// (splitmix64), so it is identical on every machine and after every restart; the position
// (epoch, offset) is all that a checkpoint needs to resume the exact sequence.
//
// The ranks read one global stream: the epochs' orders (each padded or cut to a multiple of R)
// one after another, with rank r taking positions offset + r, offset + r + R, ... All ranks
// advance the offset by R per window, so they agree on it, and a job resumed at another world
// size continues the same global stream from any offset, divisible by its R or not.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace meshtrain::data {

struct SamplerOptions {
  int64_t num_windows = 0;
  uint64_t seed = 0;
  bool shuffle = true;
  int64_t num_replicas = 1;
  int64_t rank = 0;
  // Only with num_replicas > 1 and a dataset size not divisible by it: true drops the tail of
  // each epoch's permutation, false pads it with its first positions.
  bool drop_last = false;
  // The dataset's shards as cumulative window counts (TokenDataset::shard_window_ends; the last
  // is num_windows), or empty when the dataset has no shards.
  std::vector<int64_t> shard_ends = {};
  // With shuffle and shard_ends: shards per block (above); 0 shuffles all windows together.
  int64_t shard_block = 0;
};

// Where a sampler stands. `offset` counts positions of the epoch's global (all-rank) order
// already consumed, so a position saved at one world size resumes at any other.
struct SamplerState {
  int64_t epoch = 0;
  int64_t offset = 0;

  nlohmann::json to_json() const;
  static SamplerState from_json(const nlohmann::json& j);  // ValueError on a malformed object
  friend bool operator==(const SamplerState&, const SamplerState&) = default;
};

class Sampler {
 public:
  explicit Sampler(const SamplerOptions& options);

  const SamplerOptions& options() const { return options_; }
  // Windows this rank sees per epoch (the same on every rank).
  int64_t samples_per_epoch() const { return per_rank_; }
  // Positions of one epoch's global stream: samples_per_epoch() x num_replicas.
  int64_t epoch_length() const { return per_rank_ * options_.num_replicas; }
  // This rank's windows for one epoch, in order.
  std::vector<int64_t> epoch_indices(int64_t epoch) const;

  // The next n windows of this rank, crossing into the next epoch when one ends.
  std::vector<int64_t> next(int64_t n);
  // The same, and in `epochs` the epoch each window was drawn in (a batch may straddle an
  // epoch's end): for what is keyed by the visit as well as the window, an image's augmentation.
  std::vector<int64_t> next(int64_t n, std::vector<int64_t>& epochs);

  // The shards this rank reads next: every shard of the block its next window lies in, then
  // `ahead` more in the order the sampler comes to them (into the next epoch). Sequential
  // order reads one shard at a time; a shuffle of all windows needs every shard at once. Empty
  // without shard_ends.
  std::vector<int64_t> upcoming_shards(int64_t ahead) const;

  SamplerState state() const;
  // An offset at or past this world's epoch length (the padded tail of a larger world) moves
  // to the start of the next epoch. ValueError for a negative position or an offset no world
  // size can reach (2 x the dataset or more).
  void set_state(const SamplerState& state);
  void reset() { set_state({}); }

 private:
  // The global permutation of `epoch` (two are kept: a rank can read across an epoch's end).
  const std::vector<int64_t>& permutation(int64_t epoch);

  SamplerOptions options_;
  int64_t per_rank_ = 0;  // windows per rank per epoch
  int64_t epoch_ = 0;
  int64_t offset_ = 0;  // global positions of epoch_ consumed, in [0, epoch_length())
  int64_t cached_for_[2] = {-1, -1};
  std::vector<int64_t> cache_[2];
};

// A permutation of [0, n) keyed on (seed, epoch) (identity when shuffle is false).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

// The global order of one epoch's windows: epoch_permutation of them all, or block by block of
// shards (shard_block above).
std::vector<int64_t> epoch_order(const SamplerOptions& options, int64_t epoch);

}  // namespace meshtrain::data
