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

const std::vector<int64_t>& Sampler::permutation(int64_t epoch) {
  const size_t slot = static_cast<size_t>(epoch % 2);
  if (cached_for_[slot] != epoch) {
    cache_[slot] = epoch_permutation(options_.num_windows, options_.seed, epoch, options_.shuffle);
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
