// Elementwise over the parameters, so any thread split gives the same bits. The options are
// template parameters so that each combination compiles to a branch-free, vectorised loop.
#include "meshtrain/tensor/cpu/sgd.h"

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

struct SgdScalars {
  float neg_lr, momentum, keep, weight_decay;
};

template <bool kDecay, bool kMomentum, bool kNesterov, bool kFirst>
void sgd_loop(float* param, const float* grad, float* buf, int64_t n, const SgdScalars& s) {
#pragma omp parallel for simd schedule(static) if (worth_parallel(n * 4))
  for (int64_t i = 0; i < n; ++i) {
    float d = grad[i];
    if constexpr (kDecay) d = d + s.weight_decay * param[i];
    if constexpr (kMomentum) {
      float b = d;
      if constexpr (!kFirst) b = buf[i] * s.momentum + s.keep * d;
      buf[i] = b;
      d = kNesterov ? d + s.momentum * b : b;
    }
    param[i] = param[i] + s.neg_lr * d;
  }
}

template <bool kDecay, bool kMomentum, bool kNesterov>
void sgd_first(bool first, float* param, const float* grad, float* buf, int64_t n,
               const SgdScalars& s) {
  if (first) {
    sgd_loop<kDecay, kMomentum, kNesterov, true>(param, grad, buf, n, s);
  } else {
    sgd_loop<kDecay, kMomentum, kNesterov, false>(param, grad, buf, n, s);
  }
}

template <bool kDecay>
void sgd_momentum(bool momentum, bool nesterov, bool first, float* param, const float* grad,
                  float* buf, int64_t n, const SgdScalars& s) {
  if (!momentum) {
    sgd_loop<kDecay, false, false, false>(param, grad, buf, n, s);
  } else if (nesterov) {
    sgd_first<kDecay, true, true>(first, param, grad, buf, n, s);
  } else {
    sgd_first<kDecay, true, false>(first, param, grad, buf, n, s);
  }
}

}  // namespace

void sgd_step(float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
              float momentum, float dampening, float weight_decay, bool nesterov, bool first_step) {
  KernelTimer timer(KernelKind::optimizer);
  MT_CHECK(momentum == 0.0f || momentum_buf != nullptr, "sgd_step: momentum needs a buffer");
  MT_CHECK(!nesterov || (momentum > 0.0f && dampening == 0.0f),
           "sgd_step: Nesterov momentum requires a momentum and zero dampening");
  const SgdScalars s{-lr, momentum, static_cast<float>(1.0 - static_cast<double>(dampening)),
                     weight_decay};
  const bool use_momentum = momentum != 0.0f;
  if (weight_decay != 0.0f) {
    sgd_momentum<true>(use_momentum, nesterov, first_step, param, grad, momentum_buf, n, s);
  } else {
    sgd_momentum<false>(use_momentum, nesterov, first_step, param, grad, momentum_buf, n, s);
  }
}

}  // namespace meshtrain::cpu
