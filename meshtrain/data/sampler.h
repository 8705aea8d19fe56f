// The order in which training visits dataset windows. One class covers the three cases:
//   - random (num_replicas = 1): a fresh permutation every epoch,
//   - sequential (shuffle = false): 0, 1, 2, ... for evaluation,
//   - distributed (num_replicas = R): every rank computes the same epoch permutation and takes
//     positions rank, rank + R, rank + 2R, ... so ranks never overlap and together cover the
//     dataset once per epoch (padded by wrapping around, or cut with drop_last).
// Each epoch's permutation is a pure function of (seed, epoch) through a counter-based RNG
// (splitmix64), so it is identical on every machine and after every restart; the position
// (epoch, offset) is all that a checkpoint needs to resume the exact sequence.
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
};

// Where a sampler stands. `offset` counts positions of the epoch's global (all-rank) order
// already consumed, so a position saved at one world size can resume at another whenever the
// offset divides evenly.
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
  // This rank's windows for one epoch, in order.
  std::vector<int64_t> epoch_indices(int64_t epoch) const;

  // The next n windows of this rank, crossing into the next epoch when one ends.
  std::vector<int64_t> next(int64_t n);

  SamplerState state() const;
  void set_state(const SamplerState& state);  // ValueError if it does not fit this sampler
  void reset() { set_state({}); }

 private:
  const std::vector<int64_t>& cached_epoch(int64_t epoch);

  SamplerOptions options_;
  int64_t per_rank_ = 0;  // windows per rank per epoch
  int64_t epoch_ = 0;
  int64_t local_ = 0;  // position within this rank's list for epoch_
  int64_t cached_for_ = -1;
  std::vector<int64_t> cache_;
};

// The global order of one epoch: a permutation of [0, n) (identity when shuffle is false).
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch, bool shuffle);

}  // namespace meshtrain::data
