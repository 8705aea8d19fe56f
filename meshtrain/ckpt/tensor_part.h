// A tensor-parallel rank's part of a whole tensor, to and from a checkpoint. The part is
// nn::TensorShard's: part `index` of `parts` along one dimension (of each of its blocks), padded
// with zeros where the dimension does not divide (a vocabulary of 257 rows over 2 ranks). The
// checkpoint holds the whole tensor as the plain model has it, unpadded: a rank writes the real
// entries of its part as one piece of a tensor split along that dimension (nothing when its part
// is all padding), and a rank of any layout reads back the part it needs, padding zeroed, from
// whatever layout wrote it.
#pragma once

#include <string>

#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/nn/tensor_shard.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ckpt {

// Copies entries [src_begin, src_begin + n) along `dim` of each of the `blocks` equal blocks of
// `src` to entries [dst_begin, dst_begin + n) of the same blocks of `dst`: the tensors agree in
// dtype and in every other dimension; each one's blocks have its own size.
void copy_dim_range(const Tensor& src, int64_t src_begin, Tensor& dst, int64_t dst_begin, int64_t n,
                    int64_t dim, int64_t blocks);

// Adds `part` (shard.local_shape(), padded) to `shards` as its real entries of the whole tensor
// shard.full: the live tensor when it has no padding, else a copy without it; nothing when it
// is all padding.
void add_tensor_part(RankShards& shards, const std::string& group, const std::string& name,
                     const Tensor& part, const nn::TensorShard& shard);

// The part `shard` describes of the checkpoint's tensor `name` (shard.local_shape(), padding
// zero), from any layout. ValueError naming the tensor and the step when the checkpoint's
// tensor is not the whole shard.full.
Tensor load_tensor_part(const Checkpoint& checkpoint, const std::string& name,
                        const nn::TensorShard& shard);

}  // namespace meshtrain::ckpt
