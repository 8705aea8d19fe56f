#include "meshtrain/optim/loss_scaler.h"

#include <cmath>
#include <limits>
#include <vector>

#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/util/error.h"

namespace meshtrain::optim {

void LossScalerOptions::validate() const {
  if (!(std::isfinite(init_scale) && init_scale > 0))
    MT_THROW(ValueError, "loss scaler: init_scale must be finite and > 0, got ", init_scale);
  if (!(std::isfinite(growth_factor) && growth_factor > 1))
    MT_THROW(ValueError, "loss scaler: growth_factor must be > 1, got ", growth_factor);
  if (!(backoff_factor > 0 && backoff_factor < 1))
    MT_THROW(ValueError, "loss scaler: backoff_factor must be in (0, 1), got ", backoff_factor);
  if (growth_interval < 1)
    MT_THROW(ValueError, "loss scaler: growth_interval must be at least 1, got ", growth_interval);
}

LossScaler::LossScaler(LossScalerOptions options) : options_(options), scale_(options.init_scale) {
  options_.validate();
}

bool LossScaler::unscale(const NamedParams& params) const {
  const float inv = static_cast<float>(1.0 / scale_);
  constexpr float kMax = std::numeric_limits<float>::max();
  bool found = false;
  std::vector<Tensor> on_device;
  for (const auto& [name, p] : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    MT_CHECK(g.dtype() == DType::f32, "loss scaler: gradient of '", name,
             "' must be an f32 tensor, got ", g.str());
    if (!g.device().is_cpu()) {
      on_device.push_back(g);
      continue;
    }
    float* d = g.data<float>();
    const int64_t n = g.numel();
    // A NaN fails the comparison as well as an inf; the flag keeps the loop branch-free.
    int bad = 0;
#pragma omp parallel for schedule(static) reduction(| : bad) if (cpu::worth_parallel(n))
    for (int64_t i = 0; i < n; ++i) {
      bad |= !(std::fabs(d[i]) <= kMax);
      d[i] *= inv;
    }
    found = found || bad != 0;
  }
  if (!on_device.empty()) {
    // One wait for every device gradient: a gradient holds a NaN or an inf exactly when its sum
    // of squares does (summed in double, the squares of finite floats cannot overflow), and the
    // division is the same multiply by the inverse as above.
    for (double sq : ops::sum_squares_each(on_device)) found = found || !std::isfinite(sq);
    ops::scale_each_(on_device, inv);
  }
  return found;
}

DeviceSquares LossScaler::unscale_on_device(const NamedParams& params, Device device) const {
  std::vector<Tensor> grads;
  for (const auto& [name, p] : params) {
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    MT_CHECK(g.dtype() == DType::f32 && g.device() == device, "loss scaler: gradient of '", name,
             "' must be an f32 tensor on ", device.str(), ", got ", g.str());
    grads.push_back(g);
  }
  DeviceSquares out;
  out.sums = ops::sum_squares_each_on_device(grads, device);
  out.count = static_cast<int64_t>(grads.size());
  ops::scale_each_(grads, static_cast<float>(1.0 / scale_));
  return out;
}

void LossScaler::update(bool found_inf) {
  if (found_inf) {
    scale_ *= options_.backoff_factor;
    growth_tracker_ = 0;
    return;
  }
  if (++growth_tracker_ >= options_.growth_interval) {
    const double grown = scale_ * options_.growth_factor;
    // torch keeps the old scale when growing would overflow f32.
    if (grown <= std::numeric_limits<float>::max()) scale_ = grown;
    growth_tracker_ = 0;
  }
}

void LossScaler::load_state(const LossScalerState& state) {
  if (!(std::isfinite(state.scale) && state.scale > 0))
    MT_THROW(ValueError, "loss scaler state: scale must be finite and > 0, got ", state.scale);
  if (state.growth_tracker < 0)
    MT_THROW(ValueError, "loss scaler state: growth tracker must not be negative, got ",
             state.growth_tracker);
  scale_ = state.scale;
  growth_tracker_ = state.growth_tracker;
}

}  // namespace meshtrain::optim
