// out[i] = f(a[i]) or f(a[i], b[i]) over n floats, for the bandwidth-bound elementwise kernels
// (adds, scales, GELU). Four elements per thread with 16-byte loads and stores when every array
// is 16-byte aligned and n is a multiple of four (the tensors of a model almost always are), one
// otherwise; f is the same either way, so the bits do not depend on the path. out may alias an
// input.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda::detail {

template <typename F>
__global__ void map1_kernel(float* out, const float* a, int64_t n, F f) {
  MT_GRID_STRIDE(i, n) out[i] = f(a[i]);
}

template <typename F>
__global__ void map1_x4_kernel(float4* out, const float4* a, int64_t n4, F f) {
  MT_GRID_STRIDE(i, n4) {
    const float4 x = a[i];
    out[i] = make_float4(f(x.x), f(x.y), f(x.z), f(x.w));
  }
}

template <typename F>
__global__ void map2_kernel(float* out, const float* a, const float* b, int64_t n, F f) {
  MT_GRID_STRIDE(i, n) out[i] = f(a[i], b[i]);
}

template <typename F>
__global__ void map2_x4_kernel(float4* out, const float4* a, const float4* b, int64_t n4, F f) {
  MT_GRID_STRIDE(i, n4) {
    const float4 x = a[i], y = b[i];
    out[i] = make_float4(f(x.x, y.x), f(x.y, y.y), f(x.z, y.z), f(x.w, y.w));
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether arrays of n elements can be walked four elements at a time: n a multiple of four and
// every array 16-byte aligned (enough for 8-byte groups of four half values too).
inline bool quads(int64_t n, std::initializer_list<const void*> arrays) {
  if (n % 4 != 0) return false;
  for (const void* p : arrays)
    if (!aligned16(p)) return false;
  return true;
}

template <typename F>
void map(float* out, const float* a, int64_t n, F f, cudaStream_t stream) {
  if (n <= 0) return;
  if (quads(n, {out, a})) {
    map1_x4_kernel<<<grid_for(n / 4), kBlock, 0, stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(a), n / 4, f);
  } else {
    map1_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, a, n, f);
  }
  MT_CUDA_CHECK_LAUNCH();
}

template <typename F>
void map(float* out, const float* a, const float* b, int64_t n, F f, cudaStream_t stream) {
  if (n <= 0) return;
  if (quads(n, {out, a, b})) {
    map2_x4_kernel<<<grid_for(n / 4), kBlock, 0, stream>>>(
        reinterpret_cast<float4*>(out), reinterpret_cast<const float4*>(a),
        reinterpret_cast<const float4*>(b), n / 4, f);
  } else {
    map2_kernel<<<grid_for(n), kBlock, 0, stream>>>(out, a, b, n, f);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda::detail
