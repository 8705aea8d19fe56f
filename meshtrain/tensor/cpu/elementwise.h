// Elementwise kernels that the autograd layer composes into the ops without a fused kernel:
// arithmetic on equal shapes or with a trailing vector broadcast over rows, scaling, axpy,
// unary math with its backward, and the residual add. All are vectorised and split across threads
// for large n; each output element depends only on its own inputs, so results never depend on
// the thread count. out may alias an input (in-place use).
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// out[n] = a[n] op b[n].
void add(float* out, const float* a, const float* b, int64_t n);
void sub(float* out, const float* a, const float* b, int64_t n);
void mul(float* out, const float* a, const float* b, int64_t n);
void div(float* out, const float* a, const float* b, int64_t n);

// Row broadcast: out[N, C] = a[N, C] op b[C].
void add_row(float* out, const float* a, const float* b, int64_t N, int64_t C);
void sub_row(float* out, const float* a, const float* b, int64_t N, int64_t C);
void mul_row(float* out, const float* a, const float* b, int64_t N, int64_t C);
void div_row(float* out, const float* a, const float* b, int64_t N, int64_t C);

// out[n] = a[n] * s.
void scale(float* out, const float* a, float s, int64_t n);

// y[n] += alpha * x[n].
void axpy(float* y, const float* x, float alpha, int64_t n);

// out[n] = f(a[n]). exp and tanh use the vectorised approximations of vec_math.h (< 2 ulp
// relative for exp; tanh within about 1e-7 absolute); log and sqrt are the correctly rounded ones
// (log is a scalar loop: nothing on the training path needs it fast).
void exp(float* out, const float* a, int64_t n);
void log(float* out, const float* a, int64_t n);
void tanh(float* out, const float* a, int64_t n);
void sqrt(float* out, const float* a, int64_t n);

// Backwards of the unary functions, accumulating into dinp:
//   exp:  dinp += dout * out        log:  dinp += dout / inp
//   tanh: dinp += dout * (1 - out^2)  sqrt: dinp += dout * 0.5 / out
void exp_backward(float* dinp, const float* dout, const float* out, int64_t n);
void log_backward(float* dinp, const float* dout, const float* inp, int64_t n);
void tanh_backward(float* dinp, const float* dout, const float* out, int64_t n);
void sqrt_backward(float* dinp, const float* dout, const float* out, int64_t n);

// Residual connection: out = a + b forward; da += dout and db += dout backward (either may be
// nullptr).
void residual_forward(float* out, const float* a, const float* b, int64_t n);
void residual_backward(float* da, float* db, const float* dout, int64_t n);

}  // namespace meshtrain::cpu
