// TensorShard: which part of a whole tensor a module holds when a mesh dimension splits it
// (tensor parallelism). Part `index` of `parts` along `dim`: each part has ceil(size / parts)
// entries along that dimension, the last one padded with zeros where the size does not divide
// (a vocabulary of 257 over 2 ranks: 129 rows each, the second with one row of padding).
//
// A dimension made of `blocks` stacked equal blocks (the q, k and v rows of a packed attention
// projection) is split block by block: a part holds its share of every block, in block order,
// so each rank gets whole heads of q, k and v.
//
// The module draws the whole tensor from the parameter's keyed generator and keeps its part
// (take), so a tensor-parallel model holds exactly slices of the values the whole model does.
#pragma once

#include <cstdint>
#include <string>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {

struct TensorShard {
  std::string mesh_dim;  // "tp"
  Shape full;            // the whole tensor's shape (unpadded)
  int64_t dim = 0;
  int64_t blocks = 1;
  int index = 0;
  int parts = 0;  // 0: not a shard

  bool defined() const { return parts > 0; }
  // Entries of one block's part along `dim` (ceil(full[dim] / blocks / parts)).
  int64_t part_size() const;
  // The shape of this part (padded).
  Shape local_shape() const;
  // This part of `whole` (shape `full`), zero where it is padding. A new tensor.
  Tensor take(const Tensor& whole) const;
  // The inverse: writes `part` (this part's local_shape) into `whole`, padding left out.
  void put(const Tensor& part, Tensor& whole) const;
};

}  // namespace meshtrain::nn
