// Whether operations record a graph. `NoGradGuard` turns recording off for a scope (evaluation,
// optimizer updates, custom forward passes); `GradModeGuard` sets it either way (activation
// checkpointing records its recomputation inside the backward pass, where recording is off).
// The setting is per thread, like PyTorch's.
#pragma once

namespace meshtrain::autograd {

bool grad_enabled();
void set_grad_enabled(bool enabled);

class NoGradGuard {
 public:
  NoGradGuard() : prev_(grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(prev_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool prev_;
};

class GradModeGuard {
 public:
  explicit GradModeGuard(bool enabled) : prev_(grad_enabled()) { set_grad_enabled(enabled); }
  ~GradModeGuard() { set_grad_enabled(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};

}  // namespace meshtrain::autograd
