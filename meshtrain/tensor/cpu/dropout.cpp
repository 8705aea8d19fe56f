// The generator is the splitmix64 finaliser applied to the seed-mixed element index; its top 24
// bits make a uniform float in [0, 1).
#include "meshtrain/tensor/cpu/dropout.h"

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline float uniform(uint64_t seed, uint64_t index) {
  const uint64_t h = mix64(mix64(seed) + (index + 1) * 0x9e3779b97f4a7c15ULL);
  return static_cast<float>(h >> 40) * (1.0f / 16777216.0f);
}

void check_p(float p) {
  MT_CHECK(p >= 0.0f && p <= 1.0f, "dropout: p=", p, " outside [0, 1]");
}

}  // namespace

bool dropout_keep(uint64_t seed, uint64_t index, float p) {
  return uniform(seed, index) >= p;
}

void dropout_forward(float* out, const float* inp, int64_t n, float p, uint64_t seed,
                     uint64_t offset) {
  KernelTimer timer(KernelKind::elementwise);
  check_p(p);
  const float s = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static) if (worth_parallel(n * 4))
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = uniform(seed, offset + static_cast<uint64_t>(i)) >= p;
    out[i] = keep ? inp[i] * s : 0.0f;
  }
}

void dropout_backward(float* dinp, const float* dout, int64_t n, float p, uint64_t seed,
                      uint64_t offset) {
  KernelTimer timer(KernelKind::elementwise);
  check_p(p);
  const float s = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static) if (worth_parallel(n * 4))
  for (int64_t i = 0; i < n; ++i) {
    const bool keep = uniform(seed, offset + static_cast<uint64_t>(i)) >= p;
    if (keep) dinp[i] += dout[i] * s;
  }
}

}  // namespace meshtrain::cpu
