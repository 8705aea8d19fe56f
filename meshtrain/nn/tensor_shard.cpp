#include "meshtrain/nn/tensor_shard.h"

#include <algorithm>
#include <cstring>

namespace meshtrain::nn {

int64_t TensorShard::part_size() const {
  MT_CHECK(defined() && dim >= 0 && dim < static_cast<int64_t>(full.size()) && blocks > 0 &&
               full[static_cast<size_t>(dim)] % blocks == 0,
           "tensor shard of ", shape_str(full), " along dim ", dim, " in ", blocks,
           " blocks is malformed");
  const int64_t block = full[static_cast<size_t>(dim)] / blocks;
  return (block + parts - 1) / parts;
}

Shape TensorShard::local_shape() const {
  Shape s = full;
  s[static_cast<size_t>(dim)] = blocks * part_size();
  return s;
}

Tensor TensorShard::take(const Tensor& whole) const {
  MT_CHECK(whole.shape() == full, "tensor shard expects a whole tensor of ", shape_str(full),
           ", got ", shape_str(whole.shape()));
  const int64_t block = full[static_cast<size_t>(dim)] / blocks, part = part_size();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < dim; ++d) outer *= full[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(dim) + 1; d < full.size(); ++d) inner *= full[d];
  Tensor out = Tensor::zeros(local_shape(), whole.dtype());
  const size_t es = dtype_size(whole.dtype());
  const auto* src = static_cast<const char*>(whole.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const int64_t begin = static_cast<int64_t>(index) * part;
  const int64_t rows = std::clamp<int64_t>(block - begin, 0, part);  // real, not padding
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < blocks; ++b) {
      if (rows == 0) continue;
      const int64_t s = (o * blocks * block + b * block + begin) * inner;
      const int64_t d = (o * blocks * part + b * part) * inner;
      std::memcpy(dst + static_cast<size_t>(d) * es, src + static_cast<size_t>(s) * es,
                  static_cast<size_t>(rows * inner) * es);
    }
  return out;
}

}  // namespace meshtrain::nn
