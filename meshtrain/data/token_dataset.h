// A dataset of fixed-length windows over one or more token shards. Window w of a shard starts at
// token w * stride and holds context + 1 tokens: the first context are the input, the last
// context (shifted by one) the target. Windows never cross shard boundaries, so a shard is an
// independent stream of text as in llm.c. Windows are numbered globally (shard by shard) so that
// a Sampler can pick them by index and ranks can split them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

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
  // Opens DIR/<split>_*.bin (split is "train" or "val").
  static TokenDataset from_dir(const std::string& dir, std::string_view split, int64_t context,
                               int64_t stride = 0);

  int64_t context() const { return context_; }
  int64_t stride() const { return stride_; }
  int64_t num_windows() const { return window_end_.empty() ? 0 : window_end_.back(); }
  int64_t num_tokens() const { return num_tokens_; }
  int64_t num_shards() const { return static_cast<int64_t>(shards_.size()); }
  const TokenShard& shard(int64_t i) const { return *shards_.at(static_cast<size_t>(i)); }

  // One window's input and target, context tokens each.
  void window(int64_t index, int32_t* input, int32_t* target) const;
  // Input and target as int32 tensors [B, context], B = window_indices.size().
  std::pair<Tensor, Tensor> get_batch(const std::vector<int64_t>& window_indices) const;

 private:
  std::vector<std::unique_ptr<TokenShard>> shards_;  // only shards with at least one window
  std::vector<int64_t> window_end_;                  // cumulative window counts per shard
  int64_t context_ = 0;
  int64_t stride_ = 0;
  int64_t num_tokens_ = 0;
};

}  // namespace meshtrain::data
