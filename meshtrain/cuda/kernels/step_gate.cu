// One thread: the host adds the losses and the sums one after another, and a fixed order is
// what gives its bits. A step has a few hundred sums at most; the intrinsics keep nvcc from
// contracting or approximating anything the host rounds.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/step_gate.h"

namespace meshtrain::cuda {
namespace {

__global__ void step_gate_kernel(cpu::StepGate* out, const float* losses, int64_t accum,
                                 const double* pre, int64_t n_pre, const double* sums,
                                 int64_t n_split, int64_t n, double max_norm, double epsilon) {
  float loss = 0.0f;
  for (int64_t a = 0; a < accum; ++a)
    loss = __fadd_rn(loss, __fdiv_rn(losses[a], static_cast<float>(accum)));
  bool overflow = false;
  for (int64_t i = 0; i < n_pre; ++i) overflow = overflow || !isfinite(pre[i]);
  double split = 0.0, whole = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (i < n_split)
      split = __dadd_rn(split, sums[i]);
    else
      whole = __dadd_rn(whole, sums[i]);
  }
  const double norm = __dsqrt_rn(__dadd_rn(split, whole));
  float coef = 1.0f;
  if (max_norm > 0.0 && isfinite(norm)) {
    const double c = __ddiv_rn(max_norm, __dadd_rn(norm, epsilon));
    coef = c >= 1.0 ? 1.0f : __double2float_rn(c);
  }
  out->norm = norm;
  out->loss = loss;
  out->coef = coef;
  out->overflow = overflow ? 1 : 0;
  out->skip = !isfinite(loss) || overflow || !isfinite(norm) ? 1 : 0;
}

}  // namespace

void step_gate(cpu::StepGate* out, const float* losses, int64_t accum, const double* pre,
               int64_t n_pre, const double* sums, int64_t n_split, int64_t n, double max_norm,
               double epsilon, cudaStream_t stream) {
  step_gate_kernel<<<1, 1, 0, stream>>>(out, losses, accum, pre, n_pre, sums, n_split, n, max_norm,
                                        epsilon);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda
