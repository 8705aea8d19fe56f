// What one rank contributes to a checkpoint: its named tensors, grouped into files ("model",
// "optim", ...), each either replicated (every rank that holds it has the whole tensor), a
// range of one dimension of a tensor split along it (in each of the dimension's blocks, when it
// is made of stacked equal blocks), or a flat element range of a tensor viewed as
// 1-D (ZeRO's shards of its flat parameter, gradient and optimizer-state arenas). The writer
// turns this into the rank's shard files and the manifest's global view.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ckpt {

struct TensorShard {
  std::string name;  // the global tensor's name, unique across groups
  Tensor data;       // this rank's piece
  ShardKind kind = ShardKind::replicated;
  int64_t offset = 0;  // dim: the first entry held here within each block; flat: the first element
  Shape global_shape;  // dim and flat: the global tensor's shape
  int64_t dim = 0;     // dim: the dimension split
  int64_t blocks = 1;  // dim: the blocks it is made of
};

// The balanced split of `rows` over `world` ranks that load_shard uses: the first rows % world
// ranks get one row more.
struct RowRange {
  int64_t offset = 0;
  int64_t length = 0;
};
RowRange even_rows(int64_t rows, int64_t rank, int64_t world);

class RankShards {
 public:
  using Group = std::pair<std::string, std::vector<TensorShard>>;

  void add_replicated(const std::string& group, const std::string& name, const Tensor& t);
  void add_replicated(const std::string& group,
                      const std::vector<std::pair<std::string, Tensor>>& tensors);
  // `piece` holds global rows [offset, offset + piece.size(0)) of a tensor with global_rows rows.
  void add_dim0(const std::string& group, const std::string& name, const Tensor& piece,
                int64_t global_rows, int64_t offset);
  // `piece` holds entries [offset, offset + length) along `dim` of each of the `blocks` equal
  // blocks that dimension of a tensor of global_shape is made of, block after block (length:
  // piece.size(dim) / blocks); every other dimension whole. The ranks' pieces must tile each
  // block (copies of one range allowed), or the save fails.
  void add_dim(const std::string& group, const std::string& name, const Tensor& piece,
               const Shape& global_shape, int64_t dim, int64_t blocks, int64_t offset);
  // `piece` (1-D) holds elements [begin, begin + piece.numel()) of a tensor of global_shape
  // viewed as 1-D in row-major order; the range need not follow rows. The manifest keeps
  // global_shape, so the tensor loads whole in its own shape. The ranks' pieces must tile the
  // tensor (copies of one range allowed, empty pieces ignored), or the save fails.
  void add_flat(const std::string& group, const std::string& name, const Tensor& piece,
                const Shape& global_shape, int64_t begin);

  const std::vector<Group>& groups() const { return groups_; }
  std::vector<Group>& groups() { return groups_; }
  uint64_t nbytes() const;
  bool empty() const { return groups_.empty(); }

 private:
  std::vector<TensorShard>& group(const std::string& name);
  std::vector<Group> groups_;
};

}  // namespace meshtrain::ckpt
