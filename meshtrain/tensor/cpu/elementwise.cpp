// Two loop shapes (flat and row-broadcast) instantiated with small lambdas; the compiler inlines
// and vectorises each one. Serial below parallel.h's threshold.
#include "meshtrain/tensor/cpu/elementwise.h"

#if defined(__AVX__)
#include <immintrin.h>
#endif

#include <cmath>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/tensor/cpu/vec_math.h"

namespace meshtrain::cpu {
namespace {

template <typename F>
void map_unary(float* out, const float* a, int64_t n, int64_t cost, F f) {
#pragma omp parallel for simd schedule(static) if (worth_parallel(n * cost))
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i]);
}

template <typename F>
void map_binary(float* out, const float* a, const float* b, int64_t n, F f) {
#pragma omp parallel for simd schedule(static) if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) out[i] = f(a[i], b[i]);
}

template <typename F>
void map_grad(float* dinp, const float* dout, const float* saved, int64_t n, F f) {
#pragma omp parallel for simd schedule(static) if (worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) dinp[i] += f(dout[i], saved[i]);
}

template <typename F>
void map_row(float* out, const float* a, const float* b, int64_t N, int64_t C, F f) {
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t r = 0; r < N; ++r) {
    const float* x = a + r * C;
    float* y = out + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = f(x[c], b[c]);
  }
}

}  // namespace

void add(float* out, const float* a, const float* b, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_binary(out, a, b, n, [](float x, float y) { return x + y; });
}
void sub(float* out, const float* a, const float* b, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_binary(out, a, b, n, [](float x, float y) { return x - y; });
}
void mul(float* out, const float* a, const float* b, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_binary(out, a, b, n, [](float x, float y) { return x * y; });
}
void div(float* out, const float* a, const float* b, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_binary(out, a, b, n, [](float x, float y) { return x / y; });
}

void add_row(float* out, const float* a, const float* b, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
  map_row(out, a, b, N, C, [](float x, float y) { return x + y; });
}
void sub_row(float* out, const float* a, const float* b, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
  map_row(out, a, b, N, C, [](float x, float y) { return x - y; });
}
void mul_row(float* out, const float* a, const float* b, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
  map_row(out, a, b, N, C, [](float x, float y) { return x * y; });
}
void div_row(float* out, const float* a, const float* b, int64_t N, int64_t C) {
  KernelTimer timer(KernelKind::elementwise);
  map_row(out, a, b, N, C, [](float x, float y) { return x / y; });
}

void scale(float* out, const float* a, float s, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_unary(out, a, n, 1, [s](float x) { return x * s; });
}

void axpy(float* y, const float* x, float alpha, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_grad(y, x, x, n, [alpha](float g, float) { return alpha * g; });
}

void exp(float* out, const float* a, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_unary(out, a, n, 8, [](float x) { return fast_exp(x); });
}
void log(float* out, const float* a, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_unary(out, a, n, 16, [](float x) { return std::log(x); });
}
void tanh(float* out, const float* a, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_unary(out, a, n, 8, [](float x) { return fast_tanh(x); });
}
void sqrt(float* out, const float* a, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
#if defined(__AVX__)
  // sqrtf keeps the auto-vectoriser out (errno), so the 8-lane body is written by hand; sqrt is
  // correctly rounded in both forms, so the scalar tail gives the same bits.
  const int64_t blocks = n / 8;
#pragma omp parallel for schedule(static) if (worth_parallel(n * 2))
  for (int64_t b = 0; b < blocks; ++b) {
    _mm256_storeu_ps(out + b * 8, _mm256_sqrt_ps(_mm256_loadu_ps(a + b * 8)));
  }
  for (int64_t i = blocks * 8; i < n; ++i) out[i] = std::sqrt(a[i]);
#else
  map_unary(out, a, n, 2, [](float x) { return std::sqrt(x); });
#endif
}

void exp_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_grad(dinp, dout, out, n, [](float g, float y) { return g * y; });
}
void log_backward(float* dinp, const float* dout, const float* inp, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_grad(dinp, dout, inp, n, [](float g, float x) { return g / x; });
}
void tanh_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_grad(dinp, dout, out, n, [](float g, float y) { return g * (1.0f - y * y); });
}
void sqrt_backward(float* dinp, const float* dout, const float* out, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  map_grad(dinp, dout, out, n, [](float g, float y) { return g * 0.5f / y; });
}

void residual_forward(float* out, const float* a, const float* b, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  add(out, a, b, n);
}

void residual_backward(float* da, float* db, const float* dout, int64_t n) {
  KernelTimer timer(KernelKind::elementwise);
  if (da != nullptr) axpy(da, dout, 1.0f, n);
  if (db != nullptr) axpy(db, dout, 1.0f, n);
}

}  // namespace meshtrain::cpu
