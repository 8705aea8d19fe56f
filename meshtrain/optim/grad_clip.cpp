// Clipping: the norm in double, the scale applied in float like torch's grad.mul_(clip_coef).
#include "meshtrain/optim/grad_clip.h"

#include <cmath>
#include <utility>
#include <vector>

#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"

namespace meshtrain::optim {

namespace {

// The gradients the parameters have, in list order.
std::vector<Tensor> gradients(const NamedParams& params) {
  std::vector<Tensor> grads;
  grads.reserve(params.size());
  for (const auto& [name, p] : params)
    if (Tensor g = p.grad(); g.defined()) grads.push_back(std::move(g));
  return grads;
}

}  // namespace

double grad_norm_squared(const NamedParams& params) {
  const std::vector<Tensor> grads = gradients(params);
  // All of them at once: on a device that is one wait for the device, not one per parameter.
  double total = 0.0;
  for (const double s : ops::sum_squares_each(grads)) total += s;
  return total;
}

void check_max_norm(double max_norm) {
  if (!std::isfinite(max_norm) || max_norm <= 0.0) {
    MT_THROW(ValueError, "gradient clipping: max_norm must be finite and > 0, got ", max_norm);
  }
}

float clip_coefficient(double total_norm, double max_norm) {
  check_max_norm(max_norm);
  if (!std::isfinite(total_norm)) return 1.0f;
  const double coef = max_norm / (total_norm + kClipEpsilon);
  return coef >= 1.0 ? 1.0f : static_cast<float>(coef);
}

double clip_grad_norm_with_total(const NamedParams& params, double total_norm, double max_norm) {
  const float scale = clip_coefficient(total_norm, max_norm);
  if (scale == 1.0f) return total_norm;
  ops::scale_each_(gradients(params), scale);
  return total_norm;
}

double clip_grad_norm(const NamedParams& params, double max_norm) {
  return clip_grad_norm_with_total(params, std::sqrt(grad_norm_squared(params)), max_norm);
}

}  // namespace meshtrain::optim
