// TokenDataset: shard bookkeeping and window gathering.
#include "meshtrain/data/token_dataset.h"

#include <algorithm>
#include <filesystem>

#include "meshtrain/util/error.h"
#include "meshtrain/util/log.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

std::vector<std::string> find_shards(const std::string& dir, std::string_view split) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) {
    // A relative path is read from where the command runs, which a launcher may not share.
    const std::string where = fs::path(dir).is_relative()
                                  ? " (a relative path, resolved from the current directory " +
                                        fs::current_path(ec).string() + ")"
                                  : "";
    MT_THROW(IoError, "data directory ", dir, where,
             " does not exist; create it with `meshtrain data prepare --input TEXT --out ", dir,
             "`");
  }
  const std::string prefix = std::string(split) + "_";
  std::vector<std::string> paths;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > prefix.size() + 4 && name.starts_with(prefix) && name.ends_with(".bin") &&
        entry.is_regular_file()) {
      paths.push_back(entry.path().string());
    }
  }
  if (ec) MT_THROW(IoError, "cannot list data directory ", dir, ": ", ec.message());
  if (paths.empty()) {
    MT_THROW(IoError, "no ", prefix, "*.bin shards in ", dir,
             "; create them with `meshtrain data prepare --input TEXT --out ", dir, "`");
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

TokenDataset::TokenDataset(const std::vector<std::string>& shard_paths, int64_t context,
                           int64_t stride)
    : context_(context), stride_(stride == 0 ? context : stride) {
  if (context_ < 1) MT_THROW(ValueError, "dataset context must be positive, got ", context_);
  if (stride_ < 1) MT_THROW(ValueError, "dataset stride must be positive, got ", stride);
  MT_CHECK(!shard_paths.empty(), "dataset without shards");
  const int64_t need = context_ + 1;
  std::string first_short;
  int64_t first_short_tokens = 0;
  int64_t total = 0;
  for (const std::string& path : shard_paths) {
    auto shard = std::make_unique<TokenShard>(path);
    if (shard->size() < need) {
      if (first_short.empty()) {
        first_short = path;
        first_short_tokens = shard->size();
      }
      MT_LOG_DEBUG("data", "skipping ", path, ": ", shard->size(), " tokens, fewer than ", need);
      continue;
    }
    total += (shard->size() - need) / stride_ + 1;
    num_tokens_ += shard->size();
    window_end_.push_back(total);
    shards_.push_back(std::move(shard));
  }
  if (shards_.empty()) {
    MT_THROW(IoError, "dataset ", first_short, " has ", first_short_tokens,
             " tokens, needs at least ", need, " for context ", context_,
             " (lower the context or prepare more text)");
  }
  if (!first_short.empty()) {
    MT_LOG_WARN("data", "some shards are shorter than one window of ", need,
                " tokens and are skipped, e.g. ", first_short);
  }
}

TokenDataset TokenDataset::from_dir(const std::string& dir, std::string_view split, int64_t context,
                                    int64_t stride) {
  return TokenDataset(find_shards(dir, split), context, stride);
}

void TokenDataset::window(int64_t index, int32_t* input, int32_t* target) const {
  if (index < 0 || index >= num_windows()) {
    MT_THROW(ValueError, "window index ", index, " out of range [0, ", num_windows(), ")");
  }
  auto it = std::upper_bound(window_end_.begin(), window_end_.end(), index);
  const auto s = static_cast<size_t>(it - window_end_.begin());
  const int64_t local = index - (s == 0 ? 0 : window_end_[s - 1]);
  const int64_t start = local * stride_;
  const TokenShard& shard = *shards_[s];
  const auto n = static_cast<size_t>(context_);
  shard.read(start, std::span<int32_t>(input, n));
  shard.read(start + 1, std::span<int32_t>(target, n));
}

std::pair<Tensor, Tensor> TokenDataset::get_batch(
    const std::vector<int64_t>& window_indices) const {
  const auto b = static_cast<int64_t>(window_indices.size());
  MT_CHECK(b > 0, "empty batch");
  Tensor input = Tensor::empty({b, context_}, DType::i32);
  Tensor target = Tensor::empty({b, context_}, DType::i32);
  int32_t* in = input.data<int32_t>();
  int32_t* tg = target.data<int32_t>();
  for (int64_t i = 0; i < b; ++i) {
    window(window_indices[static_cast<size_t>(i)], in + i * context_, tg + i * context_);
  }
  return {std::move(input), std::move(target)};
}

}  // namespace meshtrain::data
