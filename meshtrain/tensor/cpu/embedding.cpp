// The backward splits the channel dimension across threads: every thread walks all tokens in
// order but touches only its own columns, so no two threads write the same float and each float
// receives its contributions in token order whatever the thread count.
#include "meshtrain/tensor/cpu/embedding.h"

#include <omp.h>

#include <algorithm>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu {
namespace {

// Column slices are kept to whole multiples of this many floats (a 64-byte line) where possible.
constexpr int64_t kColumnAlign = 16;

void check_indices(const int32_t* idx, int64_t N, int64_t V) {
  for (int64_t n = 0; n < N; ++n) {
    MT_CHECK(idx[n] >= 0 && idx[n] < V, "embedding: index ", idx[n], " at position ", n,
             " is outside [0, ", V, ")");
  }
}

// Runs body(c0, c1) over a split of [0, C) into one slice per thread.
template <typename Body>
void for_column_slices(int64_t C, int64_t work, Body body) {
  if (!worth_parallel(work) || omp_get_max_threads() == 1 || C < 2 * kColumnAlign) {
    body(int64_t{0}, C);
    return;
  }
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads();
    const int64_t units = (C + kColumnAlign - 1) / kColumnAlign;
    const int64_t me = omp_get_thread_num();
    const int64_t c0 = std::min(C, units * me / threads * kColumnAlign);
    const int64_t c1 = std::min(C, units * (me + 1) / threads * kColumnAlign);
    if (c0 < c1) body(c0, c1);
  }
}

}  // namespace

void gpt_embedding_forward(float* out, const int32_t* idx, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C, int64_t V) {
  KernelTimer timer(KernelKind::elementwise);
  check_indices(idx, B * T, V);
#pragma omp parallel for schedule(static) if (worth_parallel(B * T * C))
  for (int64_t bt = 0; bt < B * T; ++bt) {
    const float* e = wte + idx[bt] * C;
    const float* p = wpe + (bt % T) * C;
    float* o = out + bt * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) o[c] = e[c] + p[c];
  }
}

void gpt_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* idx,
                            int64_t B, int64_t T, int64_t C, int64_t V) {
  KernelTimer timer(KernelKind::elementwise);
  check_indices(idx, B * T, V);
  if (dwte != nullptr) {
    for_column_slices(C, B * T * C, [&](int64_t c0, int64_t c1) {
      for (int64_t bt = 0; bt < B * T; ++bt) {
        float* d = dwte + idx[bt] * C;
        const float* g = dout + bt * C;
#pragma omp simd
        for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
      }
    });
  }
  if (dwpe != nullptr) {
#pragma omp parallel for schedule(static) if (worth_parallel(B * T * C))
    for (int64_t t = 0; t < T; ++t) {
      float* d = dwpe + t * C;
      for (int64_t b = 0; b < B; ++b) {
        const float* g = dout + (b * T + t) * C;
#pragma omp simd
        for (int64_t c = 0; c < C; ++c) d[c] += g[c];
      }
    }
  }
}

void embedding_forward(float* out, const int32_t* idx, const float* table, int64_t N, int64_t C,
                       int64_t V) {
  KernelTimer timer(KernelKind::elementwise);
  check_indices(idx, N, V);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t n = 0; n < N; ++n)
    std::copy(table + idx[n] * C, table + idx[n] * C + C, out + n * C);
}

void embedding_backward(float* dtable, const float* dout, const int32_t* idx, int64_t N, int64_t C,
                        int64_t V) {
  KernelTimer timer(KernelKind::elementwise);
  check_indices(idx, N, V);
  for_column_slices(C, N * C, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      float* d = dtable + idx[n] * C;
      const float* g = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  });
}

void vocab_lookup_forward(float* out, const int32_t* idx, const float* table, int64_t N, int64_t C,
                          int64_t begin, int64_t valid) {
  KernelTimer timer(KernelKind::elementwise);
#pragma omp parallel for schedule(static) if (worth_parallel(N * C))
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = idx[n] - begin;
    float* o = out + n * C;
    if (row >= 0 && row < valid)
      std::copy(table + row * C, table + row * C + C, o);
    else
      std::fill(o, o + C, 0.0f);
  }
}

void vocab_lookup_backward(float* dtable, const float* dout, const int32_t* idx, int64_t N,
                           int64_t C, int64_t begin, int64_t valid) {
  KernelTimer timer(KernelKind::elementwise);
  for_column_slices(C, N * C, [&](int64_t c0, int64_t c1) {
    for (int64_t n = 0; n < N; ++n) {
      const int64_t row = idx[n] - begin;
      if (row < 0 || row >= valid) continue;
      float* d = dtable + row * C;
      const float* g = dout + n * C;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) d[c] += g[c];
    }
  });
}

}  // namespace meshtrain::cpu
