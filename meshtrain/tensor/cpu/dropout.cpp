// The mask is tensor/dropout_mask.h's, which the device's kernel shares.
#include "meshtrain/tensor/cpu/dropout.h"

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/dropout_mask.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

void check_p(float p) {
  MT_CHECK(p >= 0.0f && p <= 1.0f, "dropout: p=", p, " outside [0, 1]");
}

}  // namespace

bool dropout_keep(uint64_t seed, uint64_t index, float p) {
  return dropout_mask::uniform(dropout_mask::mixed_seed(seed), index) >= p;
}

void dropout_forward(float* out, const float* inp, int64_t n, float p, uint64_t seed,
                     uint64_t offset) {
  KernelTimer timer(KernelKind::elementwise);
  check_p(p);
  const float s = dropout_mask::keep_scale(p);
  const uint64_t mixed = dropout_mask::mixed_seed(seed);
#pragma omp parallel for schedule(static) if (worth_parallel(n * 4))
  for (int64_t i = 0; i < n; ++i)
    out[i] = dropout_mask::apply(inp[i], mixed, offset + static_cast<uint64_t>(i), p, s);
}

void dropout_backward(float* dinp, const float* dout, int64_t n, float p, uint64_t seed,
                      uint64_t offset) {
  KernelTimer timer(KernelKind::elementwise);
  check_p(p);
  const float s = dropout_mask::keep_scale(p);
  const uint64_t mixed = dropout_mask::mixed_seed(seed);
#pragma omp parallel for schedule(static) if (worth_parallel(n * 4))
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t index = offset + static_cast<uint64_t>(i);
    if (dropout_mask::uniform(mixed, index) >= p) dinp[i] += dout[i] * s;
  }
}

}  // namespace meshtrain::cpu
