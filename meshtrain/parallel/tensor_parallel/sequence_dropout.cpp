#include "meshtrain/parallel/tensor_parallel/sequence_dropout.h"

#include <vector>

#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"

namespace meshtrain::parallel::tp {

Tensor sequence_dropout(const Tensor& x, float p, uint64_t seed, uint64_t offset, bool training,
                        int64_t t0, int64_t T) {
  if (!training || p == 0.0f) return x;
  MT_CHECK(x.dim() == 3, "sequence dropout expects [B, T, C], got ", shape_str(x.shape()));
  const int64_t B = x.size(0), Tl = x.size(1), C = x.size(2);
  if (Tl == T) return autograd::dropout(x, p, seed, offset, training);
  std::vector<Tensor> rows;
  rows.reserve(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b)
    rows.push_back(autograd::dropout(autograd::narrow(x, 0, b, 1), p, seed,
                                     offset + static_cast<uint64_t>((b * T + t0) * C), training));
  return autograd::cat(rows, 0);
}

}  // namespace meshtrain::parallel::tp
