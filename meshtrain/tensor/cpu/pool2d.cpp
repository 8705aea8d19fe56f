// Direct loops over each window: pooling windows are small (2x2, 3x3) and read every input a few
// times at most, so there is nothing for a library to win. argmax is kept as an index into the
// plane (int32), enough for any image and half the memory of PyTorch's int64 indices.
#include "meshtrain/tensor/cpu/pool2d.h"

#include <algorithm>
#include <cmath>

#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/parallel.h"

namespace meshtrain::cpu {
namespace {

// The window of output (oh, ow) clipped to the image: rows [h0, h1), columns [w0, w1). padded is
// its size clipped to the padded image instead, the divisor of count_include_pad (PyTorch counts
// the padding but not what a window hangs past it).
struct Window {
  int64_t h0, h1, w0, w1, padded;
};

Window window(const Pool2dShape& s, int64_t oh, int64_t ow) {
  const int64_t hs = oh * s.stride_h - s.pad_h, ws = ow * s.stride_w - s.pad_w;
  const int64_t he = std::min(hs + s.KH, s.H + s.pad_h), we = std::min(ws + s.KW, s.W + s.pad_w);
  return {std::max<int64_t>(hs, 0), std::min(he, s.H), std::max<int64_t>(ws, 0), std::min(we, s.W),
          (he - hs) * (we - ws)};
}

float divisor(const Window& w, bool count_include_pad) {
  return static_cast<float>(count_include_pad ? w.padded : (w.h1 - w.h0) * (w.w1 - w.w0));
}

}  // namespace

void max_pool2d_forward(float* out, int32_t* argmax, const float* inp, const Pool2dShape& s) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t OH = s.out_h(), OW = s.out_w(), planes = s.N * s.C;
#pragma omp parallel for schedule(static) if (worth_parallel(planes * OH * OW * s.KH * s.KW))
  for (int64_t p = 0; p < planes; ++p) {
    const float* x = inp + p * s.H * s.W;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Window w = window(s, oh, ow);
        float best = -INFINITY;
        int64_t at = w.h0 * s.W + w.w0;
        for (int64_t h = w.h0; h < w.h1; ++h)
          for (int64_t c = w.w0; c < w.w1; ++c) {
            const float v = x[h * s.W + c];
            if (v > best || (std::isnan(v) && !std::isnan(best))) {
              best = v;
              at = h * s.W + c;
            }
          }
        const int64_t o = (p * OH + oh) * OW + ow;
        out[o] = best;
        if (argmax != nullptr) argmax[o] = static_cast<int32_t>(at);
      }
  }
}

void max_pool2d_backward(float* dinp, const float* dout, const int32_t* argmax,
                         const Pool2dShape& s) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t OHW = s.out_h() * s.out_w(), planes = s.N * s.C;
#pragma omp parallel for schedule(static) if (worth_parallel(planes * OHW))
  for (int64_t p = 0; p < planes; ++p) {
    float* dx = dinp + p * s.H * s.W;
    const float* g = dout + p * OHW;
    const int32_t* a = argmax + p * OHW;
    for (int64_t i = 0; i < OHW; ++i) dx[a[i]] += g[i];
  }
}

void avg_pool2d_forward(float* out, const float* inp, const Pool2dShape& s,
                        bool count_include_pad) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t OH = s.out_h(), OW = s.out_w(), planes = s.N * s.C;
#pragma omp parallel for schedule(static) if (worth_parallel(planes * OH * OW * s.KH * s.KW))
  for (int64_t p = 0; p < planes; ++p) {
    const float* x = inp + p * s.H * s.W;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Window w = window(s, oh, ow);
        float sum = 0.0f;
        for (int64_t h = w.h0; h < w.h1; ++h)
          for (int64_t c = w.w0; c < w.w1; ++c) sum += x[h * s.W + c];
        out[(p * OH + oh) * OW + ow] = sum / divisor(w, count_include_pad);
      }
  }
}

void avg_pool2d_backward(float* dinp, const float* dout, const Pool2dShape& s,
                         bool count_include_pad) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t OH = s.out_h(), OW = s.out_w(), planes = s.N * s.C;
#pragma omp parallel for schedule(static) if (worth_parallel(planes * OH * OW * s.KH * s.KW))
  for (int64_t p = 0; p < planes; ++p) {
    float* dx = dinp + p * s.H * s.W;
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const Window w = window(s, oh, ow);
        const float g = dout[(p * OH + oh) * OW + ow] / divisor(w, count_include_pad);
        for (int64_t h = w.h0; h < w.h1; ++h)
          for (int64_t c = w.w0; c < w.w1; ++c) dx[h * s.W + c] += g;
      }
  }
}

void global_avg_pool_forward(float* out, const float* inp, int64_t N, int64_t C, int64_t HW) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t planes = N * C;
  const double inv = HW > 0 ? 1.0 / static_cast<double>(HW) : 0.0;
#pragma omp parallel for schedule(static) if (worth_parallel(planes * HW))
  for (int64_t p = 0; p < planes; ++p) {
    const float* x = inp + p * HW;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < HW; ++i) sum += x[i];
    out[p] = static_cast<float>(sum * inv);
  }
}

void global_avg_pool_backward(float* dinp, const float* dout, int64_t N, int64_t C, int64_t HW) {
  KernelTimer timer(KernelKind::elementwise);
  const int64_t planes = N * C;
  const float inv = HW > 0 ? 1.0f / static_cast<float>(HW) : 0.0f;
#pragma omp parallel for schedule(static) if (worth_parallel(planes * HW))
  for (int64_t p = 0; p < planes; ++p) {
    const float g = dout[p] * inv;
    float* dx = dinp + p * HW;
#pragma omp simd
    for (int64_t i = 0; i < HW; ++i) dx[i] += g;
  }
}

}  // namespace meshtrain::cpu
