// A dataset of fixed-length windows over one or more token shards. Window w of a shard starts at
// token w * stride and holds context + 1 tokens: the first context are the input, the last
// context (shifted by one) the target. Windows never cross shard boundaries, so a shard is an
// independent stream of text as in llm.c. Windows are numbered globally (shard by shard) so that
// a Sampler can pick them by index and ranks can split them.
//
// A dataset built from shard headers and a ShardSource (a dataset on object storage) opens each
// shard when a window of it is first read, waiting for the source to bring it in; expect() tells
// the source which shards come next.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "meshtrain/data/shard_source.h"
#include "meshtrain/data/token_shard.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::data {

// The sorted paths of DIR/<split>_*.bin; IoError naming the directory when there are none.
std::vector<std::string> find_shards(const std::string& dir, std::string_view split);

class TokenDataset {
 public:
  // stride 0 means stride = context (non-overlapping inputs). A dataset with no complete window
  // is an IoError naming the file, its token count and the count it needs.
  TokenDataset(const std::vector<std::string>& shard_paths, int64_t context, int64_t stride = 0);
  // A shard known by its header only, brought in by a ShardSource when first read.
  struct RemoteShard {
    std::string name;  // what the source knows it by
    ShardHeader header;
  };
  TokenDataset(const std::vector<RemoteShard>& shards, std::shared_ptr<ShardSource> source,
               int64_t context, int64_t stride = 0);
  TokenDataset(TokenDataset&& other) noexcept;
  // Opens DIR/<split>_*.bin (split is "train" or "val").
  static TokenDataset from_dir(const std::string& dir, std::string_view split, int64_t context,
                               int64_t stride = 0);

  int64_t context() const { return context_; }
  int64_t stride() const { return stride_; }
  int64_t num_windows() const { return window_end_.empty() ? 0 : window_end_.back(); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  // The shard, opened (and, on demand, brought in) if it was not yet.
  const TokenShard& shard(int64_t i) const;
  const ShardHeader& shard_header(int64_t i) const {
    return shards_.at(static_cast<size_t>(i)).header;
  }
  // The shard's largest token id: the header's where recorded, else a scan (which opens it).
  int64_t shard_max_token(int64_t i) const;
  // How messages name the shard: its path, or the source's name for it.
  std::string shard_label(int64_t i) const;
  // Cumulative window counts, shard by shard (what a Sampler needs to visit shards in blocks).
  const std::vector<int64_t>& shard_window_ends() const { return window_end_; }
  // Whether shards come from a ShardSource as they are needed.
  bool on_demand() const { return source_ != nullptr; }
  // The shards (indices) the reader needs next, the most urgent first; nothing for local shards.
  // On demand, the shards not named are closed (opened again when read again): call it from the
  // one thread that reads this dataset, between batches.
  void expect(const std::vector<int64_t>& shards) const;

  // One window's input and target, context tokens each.
  void window(int64_t index, int32_t* input, int32_t* target) const;
  // Input and target as int32 tensors [B, context], B = window_indices.size().
  std::pair<Tensor, Tensor> get_batch(const std::vector<int64_t>& window_indices) const;

 private:
  struct Shard {
    std::string name;
    ShardHeader header;
    std::unique_ptr<TokenShard> open;  // null until first read when on demand
  };
  // Keeps the shards holding at least one window; a warning names a skipped one.
  void add_shards(std::vector<Shard> shards, const std::function<std::string(size_t)>& label);

  mutable std::vector<Shard> shards_;  // only shards with at least one window
  std::shared_ptr<ShardSource> source_;
  mutable std::mutex open_mu_;       // opening on demand
  std::vector<int64_t> window_end_;  // cumulative window counts per shard
  int64_t context_ = 0;
  int64_t stride_ = 0;
  int64_t num_tokens_ = 0;
};

}  // namespace meshtrain::data
