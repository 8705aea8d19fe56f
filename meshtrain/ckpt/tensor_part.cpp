#include "meshtrain/ckpt/tensor_part.h"

#include <algorithm>
#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::ckpt {

namespace {

struct PartRange {
  int64_t begin = 0;  // within each block of the whole tensor's dimension
  int64_t real = 0;   // entries that are not padding
};

PartRange real_range(const nn::TensorShard& s) {
  const int64_t block = s.full[static_cast<size_t>(s.dim)] / s.blocks, size = s.part_size();
  const int64_t begin = static_cast<int64_t>(s.index) * size;
  return {std::min(begin, block), std::clamp<int64_t>(block - begin, 0, size)};
}

}  // namespace

void copy_dim_range(const Tensor& src, int64_t src_begin, Tensor& dst, int64_t dst_begin, int64_t n,
                    int64_t dim, int64_t blocks) {
  MT_CHECK(src.dtype() == dst.dtype() && src.dim() == dst.dim() && dim >= 0 && dim < src.dim() &&
               blocks >= 1 && src.size(dim) % blocks == 0 && dst.size(dim) % blocks == 0,
           "copy_dim_range: ", src.str(), " and ", dst.str(), " along dim ", dim, " in ", blocks,
           " blocks");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < src.dim(); ++d) {
    if (d == dim) continue;
    MT_CHECK(src.size(d) == dst.size(d), "copy_dim_range: ", src.str(), " and ", dst.str(),
             " differ outside dim ", dim);
    (d < dim ? outer : inner) *= src.size(d);
  }
  const int64_t sb = src.size(dim) / blocks, db = dst.size(dim) / blocks;
  MT_CHECK(src_begin >= 0 && dst_begin >= 0 && n >= 0 && src_begin + n <= sb && dst_begin + n <= db,
           "copy_dim_range: [", src_begin, ", +", n, ") of ", sb, " into [", dst_begin, ", +", n,
           ") of ", db);
  if (n == 0) return;
  const size_t es = dtype_size(src.dtype());
  const auto* s = static_cast<const char*>(src.data_ptr());
  auto* d = static_cast<char*>(dst.data_ptr());
  const size_t bytes = static_cast<size_t>(n * inner) * es;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < blocks; ++b)
      std::memcpy(d + static_cast<size_t>(((o * blocks + b) * db + dst_begin) * inner) * es,
                  s + static_cast<size_t>(((o * blocks + b) * sb + src_begin) * inner) * es, bytes);
}

void add_tensor_part(RankShards& shards, const std::string& group, const std::string& name,
                     const Tensor& part, const nn::TensorShard& shard) {
  MT_CHECK(part.shape() == shard.local_shape(), "checkpoint: the part of '", name, "' is ",
           shape_str(part.shape()), ", its placement says ", shape_str(shard.local_shape()));
  const PartRange r = real_range(shard);
  if (r.real == 0) return;
  if (r.real == shard.part_size()) {
    shards.add_dim(group, name, part, shard.full, shard.dim, shard.blocks, r.begin);
    return;
  }
  Shape shape = shard.full;
  shape[static_cast<size_t>(shard.dim)] = r.real * shard.blocks;
  const Tensor cpu = part.to(Device::cpu());
  Tensor real = Tensor::empty(shape, part.dtype());
  copy_dim_range(cpu, 0, real, 0, r.real, shard.dim, shard.blocks);
  shards.add_dim(group, name, real, shard.full, shard.dim, shard.blocks, r.begin);
}

Tensor load_tensor_part(const Checkpoint& checkpoint, const std::string& name,
                        const nn::TensorShard& shard) {
  const TensorRecord& t = checkpoint.manifest().tensor(name);
  if (t.shape != shard.full)
    MT_THROW(ValueError, "checkpoint ", checkpoint.dir(), ": tensor '", name, "' is ",
             shape_str(t.shape), ", the model's whole tensor is ", shape_str(shard.full),
             "; it cannot be resharded into this model");
  const PartRange r = real_range(shard);
  Tensor out = Tensor::zeros(shard.local_shape(), t.dtype);
  if (r.real == 0) return out;
  const Tensor real =
      checkpoint.load_slice(name, shard.dim, r.begin, r.begin + r.real, shard.blocks);
  copy_dim_range(real, 0, out, 0, r.real, shard.dim, shard.blocks);
  return out;
}

}  // namespace meshtrain::ckpt
