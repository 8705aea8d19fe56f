// Global gradient-norm clipping with torch.nn.utils.clip_grad_norm_ semantics: the norm is the
// 2-norm of all gradients together; when max_norm / (norm + 1e-6) < 1 (the norm exceeds
// max_norm, up to that epsilon) every gradient is scaled by that factor.
//
// The norm is summed in double, parameter by parameter in list order, each with the
// thread-count-independent ops::sum_squares, so it has the same bits on every run. Split in two
// steps so that a data-parallel or sharded caller can all-reduce the local sum of squares
// (grad_norm_squared) and then clip with the global norm (clip_grad_norm_with_total).
// A non-finite norm leaves the gradients untouched and is returned as is: the caller decides
// to skip the step.
#pragma once

#include <vector>

#include "meshtrain/optim/optimizer.h"

namespace meshtrain::optim {

inline constexpr double kClipEpsilon = 1e-6;

// Sum over parameters with a gradient of the sum of squared gradient elements.
double grad_norm_squared(const NamedParams& params);
// max_norm / (total_norm + 1e-6) in float where that is below 1 and total_norm is finite, else
// 1: the factor clipping scales every gradient by, for Optimizer::step(grad_scale), which
// applies it as it reads the gradients (one pass over them fewer).
float clip_coefficient(double total_norm, double max_norm);
// ValueError unless max_norm is finite and > 0 (what clip_coefficient requires).
void check_max_norm(double max_norm);
// Scales every gradient when max_norm / (total_norm + 1e-6) < 1 and total_norm is finite;
// returns total_norm.
double clip_grad_norm_with_total(const NamedParams& params, double total_norm, double max_norm);
// Both steps for one process: returns the total norm before clipping.
double clip_grad_norm(const NamedParams& params, double max_norm);

}  // namespace meshtrain::optim
