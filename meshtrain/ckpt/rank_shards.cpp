// RankShards: argument checks happen here, on the training thread, so that a bad call fails at
// once instead of later on the writer thread.
#include "meshtrain/ckpt/rank_shards.h"

#include "meshtrain/util/error.h"

namespace meshtrain::ckpt {

RowRange even_rows(int64_t rows, int64_t rank, int64_t world) {
  MT_CHECK(world >= 1 && rank >= 0 && rank < world && rows >= 0, "bad split of ", rows,
           " rows: rank ", rank, " of ", world);
  const int64_t base = rows / world, extra = rows % world;
  return {rank * base + std::min(rank, extra), base + (rank < extra ? 1 : 0)};
}

std::vector<TensorShard>& RankShards::group(const std::string& name) {
  check_group_name(name);
  for (Group& g : groups_)
    if (g.first == name) return g.second;
  groups_.emplace_back(name, std::vector<TensorShard>{});
  return groups_.back().second;
}

void RankShards::add_replicated(const std::string& group_name, const std::string& name,
                                const Tensor& t) {
  MT_CHECK(!name.empty() && t.defined(), "checkpoint tensor '", name, "' is empty or undefined");
  group(group_name).push_back({name, t, ShardKind::replicated, 0, {}});
}

void RankShards::add_replicated(const std::string& group_name,
                                const std::vector<std::pair<std::string, Tensor>>& tensors) {
  auto& g = group(group_name);
  for (const auto& [name, t] : tensors) {
    MT_CHECK(!name.empty() && t.defined(), "checkpoint tensor '", name, "' is empty or undefined");
    g.push_back({name, t, ShardKind::replicated, 0, {}});
  }
}

void RankShards::add_dim0(const std::string& group_name, const std::string& name,
                          const Tensor& piece, int64_t global_rows, int64_t offset) {
  MT_CHECK(!name.empty() && piece.defined() && piece.dim() >= 1, "checkpoint tensor '", name,
           "' sharded on dim 0 must be defined with at least one dimension");
  MT_CHECK(offset >= 0 && offset + piece.size(0) <= global_rows, "shard of '", name, "' at rows [",
           offset, ", ", offset + piece.size(0), ") is outside its ", global_rows, " rows");
  Shape global_shape = piece.shape();
  global_shape[0] = global_rows;
  group(group_name).push_back({name, piece, ShardKind::dim, offset, global_shape, 0, 1});
}

void RankShards::add_dim(const std::string& group_name, const std::string& name,
                         const Tensor& piece, const Shape& global_shape, int64_t dim,
                         int64_t blocks, int64_t offset) {
  const int64_t rank = static_cast<int64_t>(global_shape.size());
  MT_CHECK(!name.empty() && piece.defined() && dim >= 0 && dim < rank && piece.dim() == rank,
           "checkpoint tensor '", name, "' sharded on dim ", dim, " must be defined with the ",
           rank, " dimensions of ", shape_str(global_shape));
  const int64_t whole = global_shape[static_cast<size_t>(dim)];
  MT_CHECK(blocks >= 1 && whole % blocks == 0 && piece.size(dim) % blocks == 0,
           "checkpoint tensor '", name, "': ", blocks, " blocks do not divide dim ", dim, " of ",
           shape_str(global_shape), " and of its piece ", shape_str(piece.shape()));
  const int64_t length = piece.size(dim) / blocks;
  MT_CHECK(offset >= 0 && offset + length <= whole / blocks, "shard of '", name, "' at [", offset,
           ", ", offset + length, ") of dim ", dim, " is outside its ", whole / blocks,
           " entries per block");
  for (int64_t d = 0; d < rank; ++d)
    MT_CHECK(d == dim || piece.size(d) == global_shape[static_cast<size_t>(d)], "shard of '", name,
             "' is ", shape_str(piece.shape()), ", which differs from ", shape_str(global_shape),
             " outside dim ", dim);
  group(group_name).push_back({name, piece, ShardKind::dim, offset, global_shape, dim, blocks});
}

void RankShards::add_flat(const std::string& group_name, const std::string& name,
                          const Tensor& piece, const Shape& global_shape, int64_t begin) {
  MT_CHECK(!name.empty() && piece.defined() && piece.dim() == 1, "flat checkpoint piece of '", name,
           "' must be a defined 1-D tensor");
  const int64_t numel = shape_numel(global_shape);
  MT_CHECK(begin >= 0 && begin <= numel && piece.numel() <= numel - begin, "flat piece of '", name,
           "' at elements [", begin, ", ", begin + piece.numel(), ") is outside the ", numel,
           " elements of ", shape_str(global_shape));
  group(group_name).push_back({name, piece, ShardKind::flat, begin, global_shape});
}

uint64_t RankShards::nbytes() const {
  uint64_t n = 0;
  for (const Group& g : groups_)
    for (const TensorShard& s : g.second) n += s.data.nbytes();
  return n;
}

}  // namespace meshtrain::ckpt
