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

namespace {

// Copies this part's real (non-padding) entries between the whole tensor and the part, in the
// direction `to_part` says.
void copy_part(const TensorShard& s, char* whole, char* part, size_t es, bool to_part) {
  const int64_t block = s.full[static_cast<size_t>(s.dim)] / s.blocks, size = s.part_size();
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < s.dim; ++d) outer *= s.full[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(s.dim) + 1; d < s.full.size(); ++d) inner *= s.full[d];
  const int64_t begin = static_cast<int64_t>(s.index) * size;
  const int64_t rows = std::clamp<int64_t>(block - begin, 0, size);  // real, not padding
  if (rows == 0) return;
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t b = 0; b < s.blocks; ++b) {
      char* w =
          whole + static_cast<size_t>((o * s.blocks * block + b * block + begin) * inner) * es;
      char* p = part + static_cast<size_t>((o * s.blocks * size + b * size) * inner) * es;
      const size_t n = static_cast<size_t>(rows * inner) * es;
      if (to_part)
        std::memcpy(p, w, n);
      else
        std::memcpy(w, p, n);
    }
}

}  // namespace

void TensorShard::put(const Tensor& part, Tensor& whole) const {
  MT_CHECK(whole.shape() == full && part.shape() == local_shape() && part.dtype() == whole.dtype(),
           "tensor shard: cannot put ", part.str(), " into ", whole.str(), " as part ", index,
           " of ", parts);
  copy_part(*this, static_cast<char*>(whole.data_ptr()), static_cast<char*>(part.data_ptr()),
            dtype_size(whole.dtype()), false);
}

Tensor TensorShard::take(const Tensor& whole) const {
  MT_CHECK(whole.shape() == full, "tensor shard expects a whole tensor of ", shape_str(full),
           ", got ", shape_str(whole.shape()));
  Tensor out = Tensor::zeros(local_shape(), whole.dtype());
  copy_part(*this, static_cast<char*>(whole.data_ptr()), static_cast<char*>(out.data_ptr()),
            dtype_size(whole.dtype()), true);
  return out;
}

}  // namespace meshtrain::nn
