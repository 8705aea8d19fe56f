#include "meshtrain/tensor/cpu/step_gate.h"

#include <cmath>

namespace meshtrain::cpu {

void step_gate(StepGate* out, const float* losses, int64_t accum, const double* pre, int64_t n_pre,
               const double* sums, int64_t n_split, int64_t n, double max_norm, double epsilon) {
  float loss = 0.0f;
  for (int64_t a = 0; a < accum; ++a) loss += losses[a] / static_cast<float>(accum);
  bool overflow = false;
  for (int64_t i = 0; i < n_pre; ++i) overflow = overflow || !std::isfinite(pre[i]);
  double split = 0.0, whole = 0.0;
  for (int64_t i = 0; i < n; ++i) (i < n_split ? split : whole) += sums[i];
  const double norm = std::sqrt(split + whole);
  float coef = 1.0f;
  if (max_norm > 0.0 && std::isfinite(norm)) {
    const double c = max_norm / (norm + epsilon);
    coef = c >= 1.0 ? 1.0f : static_cast<float>(c);
  }
  out->norm = norm;
  out->loss = loss;
  out->coef = coef;
  out->overflow = overflow ? 1 : 0;
  out->skip = !std::isfinite(loss) || overflow || !std::isfinite(norm) ? 1 : 0;
}

}  // namespace meshtrain::cpu
