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
  if (stride_ < 1) MT_THROW(ValueError, "dataset stride must be positive, got ", stride_);
  MT_CHECK(!shard_paths.empty(), "dataset without shards");
  std::vector<Shard> shards;
  for (const std::string& path : shard_paths) {
    auto open = std::make_unique<TokenShard>(path);
    const ShardHeader header = open->header();
    shards.push_back({path, header, std::move(open)});
  }
  add_shards(std::move(shards), [&](size_t i) { return shard_paths[i]; });
}

TokenDataset::TokenDataset(const std::vector<RemoteShard>& shards,
                           std::shared_ptr<ShardSource> source, int64_t context, int64_t stride)
    : source_(std::move(source)), context_(context), stride_(stride == 0 ? context : stride) {
  if (context_ < 1) MT_THROW(ValueError, "dataset context must be positive, got ", context_);
  if (stride_ < 1) MT_THROW(ValueError, "dataset stride must be positive, got ", stride_);
  MT_CHECK(!shards.empty(), "dataset without shards");
  MT_CHECK(source_ != nullptr, "remote shards without a source");
  std::vector<Shard> entries;
  for (const RemoteShard& r : shards) entries.push_back({r.name, r.header, nullptr});
  add_shards(std::move(entries), [&](size_t i) { return source_->where(shards[i].name); });
}

TokenDataset::TokenDataset(TokenDataset&& other) noexcept
    : shards_(std::move(other.shards_)),
      source_(std::move(other.source_)),
      window_end_(std::move(other.window_end_)),
      context_(other.context_),
      stride_(other.stride_),
      num_tokens_(other.num_tokens_) {}

void TokenDataset::add_shards(std::vector<Shard> shards,
                              const std::function<std::string(size_t)>& label) {
  const int64_t need = context_ + 1;
  std::string first_short;
  int64_t first_short_tokens = 0;
  int64_t total = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    const int64_t tokens = shards[i].header.num_tokens;
    if (tokens < need) {
      if (first_short.empty()) {
        first_short = label(i);
        first_short_tokens = tokens;
      }
      MT_LOG_DEBUG("data", "skipping ", label(i), ": ", tokens, " tokens, fewer than ", need);
      continue;
    }
    total += (tokens - need) / stride_ + 1;
    num_tokens_ += tokens;
    window_end_.push_back(total);
    shards_.push_back(std::move(shards[i]));
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

const TokenShard& TokenDataset::shard(int64_t i) const {
  Shard& s = shards_.at(static_cast<size_t>(i));
  if (source_ == nullptr) return *s.open;
  const std::lock_guard<std::mutex> lock(open_mu_);
  if (s.open == nullptr) {
    std::unique_ptr<TokenShard> open;
    try {
      open = std::make_unique<TokenShard>(source_->require(s.name));
    } catch (const IoError&) {
      // A bounded cache shared by the host's processes may evict the file between the source
      // saying it is there and this open; the source fetches it again when asked again.
      open = std::make_unique<TokenShard>(source_->require(s.name));
    }
    // The listing and the header read when the run started must still describe the object.
    if (open->size() != s.header.num_tokens || open->width() != s.header.width) {
      MT_THROW(IoError, source_->where(s.name), " changed while the run read it: it now holds ",
               open->size(), " tokens, the run started with ", s.header.num_tokens,
               "; restart the run once the dataset is no longer being written");
    }
    s.open = std::move(open);
  }
  return *s.open;
}

int64_t TokenDataset::shard_max_token(int64_t i) const {
  const ShardHeader& h = shard_header(i);
  return h.max_token ? *h.max_token : shard(i).max_token();
}

std::string TokenDataset::shard_label(int64_t i) const {
  const Shard& s = shards_.at(static_cast<size_t>(i));
  return source_ == nullptr ? s.open->path() : source_->where(s.name);
}

void TokenDataset::expect(const std::vector<int64_t>& shards) const {
  if (source_ == nullptr) return;
  std::vector<std::string> names;
  names.reserve(shards.size());
  std::vector<bool> wanted(shards_.size(), false);
  for (const int64_t i : shards) {
    names.push_back(shards_.at(static_cast<size_t>(i)).name);
    wanted[static_cast<size_t>(i)] = true;
  }
  {
    // Shards the reader has left are unmapped, so that a bounded cache can return their space.
    const std::lock_guard<std::mutex> lock(open_mu_);
    for (size_t i = 0; i < shards_.size(); ++i)
      if (!wanted[i]) shards_[i].open.reset();
  }
  source_->expect(names);
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
  const TokenShard& shard = this->shard(static_cast<int64_t>(s));
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
