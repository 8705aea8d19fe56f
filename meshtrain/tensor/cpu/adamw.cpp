// Elementwise over the parameters. The loop is written with AVX intrinsics because its sqrt
// keeps the auto-vectoriser out (sqrtf may set errno without -fno-math-errno). Every element,
// including a ragged tail (run through a padded 8-lane block), takes the same instruction
// sequence, so the bits do not depend on how the array is split across threads.
#include "meshtrain/tensor/cpu/adamw.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

// Elements per parallel work item: a multiple of the 8-lane width.
constexpr int64_t kBlock = 2048;

struct AdamWScalars {
  float decay, beta1, beta2, one_minus_b1, one_minus_b2, neg_step_size, bias2_sqrt, eps, grad_scale;
};

#if defined(__AVX__)
// count <= 8 elements starting at i; a full block reads and writes in place.
void adamw_lanes(float* param, const float* grad, float* m, float* v, int64_t count,
                 const AdamWScalars& s) {
  alignas(32) float pp[8] = {}, gg[8] = {}, mm[8] = {}, vv[8] = {};
  const bool full = count == 8;
  if (!full) {
    std::copy(param, param + count, pp);
    std::copy(grad, grad + count, gg);
    std::copy(m, m + count, mm);
    std::copy(v, v + count, vv);
  }
  const __m256 g = _mm256_mul_ps(_mm256_loadu_ps(full ? grad : gg), _mm256_set1_ps(s.grad_scale));
  const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(full ? param : pp), _mm256_set1_ps(s.decay));
  const __m256 mi =
      _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(full ? m : mm), _mm256_set1_ps(s.beta1)),
                    _mm256_mul_ps(g, _mm256_set1_ps(s.one_minus_b1)));
  const __m256 vi =
      _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(full ? v : vv), _mm256_set1_ps(s.beta2)),
                    _mm256_mul_ps(_mm256_mul_ps(g, g), _mm256_set1_ps(s.one_minus_b2)));
  const __m256 denom = _mm256_add_ps(
      _mm256_div_ps(_mm256_sqrt_ps(vi), _mm256_set1_ps(s.bias2_sqrt)), _mm256_set1_ps(s.eps));
  const __m256 out =
      _mm256_add_ps(p, _mm256_mul_ps(_mm256_set1_ps(s.neg_step_size), _mm256_div_ps(mi, denom)));
  if (full) {
    _mm256_storeu_ps(param, out);
    _mm256_storeu_ps(m, mi);
    _mm256_storeu_ps(v, vi);
    return;
  }
  _mm256_store_ps(pp, out);
  _mm256_store_ps(mm, mi);
  _mm256_store_ps(vv, vi);
  std::copy(pp, pp + count, param);
  std::copy(mm, mm + count, m);
  std::copy(vv, vv + count, v);
}
#else
void adamw_lanes(float* param, const float* grad, float* m, float* v, int64_t count,
                 const AdamWScalars& s) {
  for (int64_t i = 0; i < count; ++i) {
    const float g = grad[i] * s.grad_scale;
    const float p = param[i] * s.decay;
    const float mi = m[i] * s.beta1 + g * s.one_minus_b1;
    const float vi = v[i] * s.beta2 + (g * g) * s.one_minus_b2;
    m[i] = mi;
    v[i] = vi;
    param[i] = p + s.neg_step_size * (mi / (std::sqrt(vi) / s.bias2_sqrt + s.eps));
  }
}
#endif

}  // namespace

void adamw_step(float* param, const float* grad, float* m, float* v, int64_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, int64_t t,
                float grad_scale) {
  KernelTimer timer(KernelKind::optimizer);
  MT_CHECK(t >= 1, "adamw_step: step must be >= 1, got ", t);
  const double bias1 = 1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t));
  const double bias2 = 1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t));
  const AdamWScalars s{
      static_cast<float>(1.0 - static_cast<double>(lr) * weight_decay),
      beta1,
      beta2,
      static_cast<float>(1.0 - beta1),
      static_cast<float>(1.0 - beta2),
      static_cast<float>(-(static_cast<double>(lr) / bias1)),
      static_cast<float>(std::sqrt(bias2)),
      eps,
      grad_scale,
  };
  const int64_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (worth_parallel(n * 4))
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t hi = std::min(n, (b + 1) * kBlock);
    for (int64_t i = b * kBlock; i < hi; i += 8) {
      adamw_lanes(param + i, grad + i, m + i, v + i, std::min<int64_t>(8, hi - i), s);
    }
  }
}

}  // namespace meshtrain::cpu
