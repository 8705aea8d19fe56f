// Sampler: a Fisher-Yates shuffle driven by splitmix64 draws keyed on (seed, epoch), then a
// strided split across replicas.
#include "meshtrain/data/sampler.h"

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

Sampler::Sampler(const SamplerOptions& options) : options_(options) {
  MT_CHECK(options_.num_windows > 0, "sampler over an empty dataset");
  if (options_.num_replicas < 1 || options_.rank < 0 || options_.rank >= options_.num_replicas) {
    MT_THROW(ValueError, "sampler: rank ", options_.rank, " is not in [0, ", options_.num_replicas,
             ")");
  }
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
  std::vector<int64_t> perm = epoch_permutation(n, options_.seed, epoch, options_.shuffle);
  std::vector<int64_t> mine(static_cast<size_t>(per_rank_));
  for (int64_t k = 0; k < per_rank_; ++k) {
    int64_t pos = options_.rank + k * r;  // < per_rank_ * r, which is <= n + r - 1
    mine[static_cast<size_t>(k)] = perm[static_cast<size_t>(pos % n)];
  }
  return mine;
}

const std::vector<int64_t>& Sampler::cached_epoch(int64_t epoch) {
  if (cached_for_ != epoch) {
    cache_ = epoch_indices(epoch);
    cached_for_ = epoch;
  }
  return cache_;
}

std::vector<int64_t> Sampler::next(int64_t n) {
  MT_CHECK(n >= 0, "negative sample count ", n);
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(n));
  while (static_cast<int64_t>(out.size()) < n) {
    if (local_ == per_rank_) {
      ++epoch_;
      local_ = 0;
    }
    const std::vector<int64_t>& order = cached_epoch(epoch_);
    int64_t take = std::min(n - static_cast<int64_t>(out.size()), per_rank_ - local_);
    out.insert(out.end(), order.begin() + local_, order.begin() + local_ + take);
    local_ += take;
  }
  return out;
}

SamplerState Sampler::state() const {
  // A finished epoch is reported as the start of the next one: the same position, one form.
  if (local_ == per_rank_) return {epoch_ + 1, 0};
  return {epoch_, local_ * options_.num_replicas};
}

void Sampler::set_state(const SamplerState& state) {
  const int64_t r = options_.num_replicas;
  if (state.epoch < 0 || state.offset < 0 || state.offset % r != 0 ||
      state.offset / r > per_rank_) {
    MT_THROW(ValueError, "sampler state (epoch ", state.epoch, ", offset ", state.offset,
             ") does not fit this sampler (", r, " replicas, ", per_rank_,
             " windows per replica per epoch)");
  }
  epoch_ = state.epoch;
  local_ = state.offset / r;
}

}  // namespace meshtrain::data
