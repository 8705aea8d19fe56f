// Whether operations record a graph. `NoGradGuard` turns recording off for a scope (evaluation,
// optimizer updates, custom forward passes); the setting is per thread, like PyTorch's.
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

}  // namespace meshtrain::autograd
