#include "meshtrain/parallel/sync_batch_norm.h"

#include <algorithm>
#include <array>
#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

namespace {

// What a replica says it is about to exchange: fixed size, so that replicas at different layers
// still complete the announcement and can name each other.
struct Announcement {
  std::array<char, 96> layer{};  // the module name, cut at 95 characters
  uint64_t call = 0;
  uint64_t values = 0;
  uint8_t pass = 0;
  std::array<uint8_t, 7> pad{};
};

std::string layer_name(const Announcement& a) {
  return std::string(a.layer.data(), strnlen(a.layer.data(), a.layer.size()));
}

const char* pass_name(uint8_t pass) {
  return pass == 0 ? "forward" : "backward";
}

}  // namespace

SyncBatchNorm::SyncBatchNorm(comm::ProcessGroupPtr replicas) : replicas_(std::move(replicas)) {}

void SyncBatchNorm::announce(const std::string& layer, Pass pass, size_t values) {
  Announcement mine;
  std::memcpy(mine.layer.data(), layer.data(), std::min(layer.size(), mine.layer.size() - 1));
  mine.call = calls_;
  mine.values = values;
  mine.pass = static_cast<uint8_t>(pass);
  const int world = replicas_->size();
  std::vector<Announcement> all(static_cast<size_t>(world));
  replicas_->all_gather(&mine, all.data(), sizeof(Announcement), DType::u8)->wait();
  for (int r = 0; r < world; ++r) {
    const Announcement& a = all[static_cast<size_t>(r)];
    if (a.call == mine.call && a.pass == mine.pass && a.values == mine.values &&
        layer_name(a) == layer_name(mine))
      continue;
    MT_THROW(ValueError, "SyncBatchNorm: rank ", replicas_->rank(), " is at layer '", layer, "' (",
             pass_name(mine.pass), ", exchange ", mine.call, ") but rank ", r, " is at layer '",
             layer_name(a), "' (", pass_name(a.pass), ", exchange ", a.call,
             "): every data-parallel rank must run the same BatchNorm layers in the same order "
             "in training mode");
  }
}

void SyncBatchNorm::exchange(const std::string& layer, Pass pass, std::vector<double>& values) {
  ++calls_;
  if (!replicas_ || replicas_->size() == 1) return;
  const int world = replicas_->size();
  std::vector<double> all(values.size() * static_cast<size_t>(world));
  try {
    announce(layer, pass, values.size());
    replicas_->all_gather(values.data(), all.data(), values.size() * sizeof(double), DType::u8)
        ->wait();
  } catch (const CommError& e) {
    MT_THROW(CommError, "SyncBatchNorm at layer '", layer, "' (",
             pass_name(static_cast<uint8_t>(pass)), "): ", e.what());
  }
  // In rank order, so that every replica adds the same numbers in the same order.
  std::fill(values.begin(), values.end(), 0.0);
  for (int r = 0; r < world; ++r)
    for (size_t i = 0; i < values.size(); ++i)
      values[i] += all[static_cast<size_t>(r) * values.size() + i];
}

void SyncBatchNorm::reduce_statistics(const std::string& layer, std::vector<double>& sums,
                                      int64_t& count) {
  // The count travels as a double: exact up to 2^53 elements per channel.
  sums.push_back(static_cast<double>(count));
  exchange(layer, Pass::forward, sums);
  count = static_cast<int64_t>(sums.back());
  sums.pop_back();
}

void SyncBatchNorm::reduce_gradients(const std::string& layer, std::vector<double>& sums) {
  exchange(layer, Pass::backward, sums);
}

}  // namespace meshtrain::parallel
