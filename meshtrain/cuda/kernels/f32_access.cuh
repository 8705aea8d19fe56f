// Element access through f32 for kernels that take f32, bf16 or f16 arrays: loads widen exactly,
// stores round to nearest even with the hardware's conversion instructions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "meshtrain/tensor/dtype.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cuda::detail {

__device__ inline float load_f32(const float* p, int64_t i) {
  return p[i];
}
__device__ inline float load_f32(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ inline float load_f32(const __half* p, int64_t i) {
  return __half2float(p[i]);
}
__device__ inline void store_f32(float* p, int64_t i, float v) {
  p[i] = v;
}
__device__ inline void store_f32(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = __float2bfloat16_rn(v);
}
__device__ inline void store_f32(__half* p, int64_t i, float v) {
  p[i] = __float2half_rn(v);
}

// Elements 2i and 2i + 1 at once: one 8-byte store for f32, one 4-byte store for a half type (the
// rounding is store_f32's).
__device__ inline void store2_f32(float* p, int64_t i, float a, float b) {
  reinterpret_cast<float2*>(p)[i] = make_float2(a, b);
}
__device__ inline void store2_f32(__nv_bfloat16* p, int64_t i, float a, float b) {
  reinterpret_cast<__nv_bfloat162*>(p)[i] = __floats2bfloat162_rn(a, b);
}
__device__ inline void store2_f32(__half* p, int64_t i, float a, float b) {
  reinterpret_cast<__half2*>(p)[i] = __floats2half2_rn(a, b);
}

// Elements 4i .. 4i + 3 at once: one 16-byte access for f32, one 8-byte access for a half type
// (the array 16-byte aligned for f32, 8-byte for half; the rounding is store_f32's).
template <typename H2>
struct alignas(8) HalfQuad {  // two pairs of half values
  H2 v[2];
};
__device__ inline float4 load4_f32(const float* p, int64_t i) {
  return reinterpret_cast<const float4*>(p)[i];
}
__device__ inline float4 load4_f32(const __nv_bfloat16* p, int64_t i) {
  const auto q = reinterpret_cast<const HalfQuad<__nv_bfloat162>*>(p)[i];
  const float2 a = __bfloat1622float2(q.v[0]), b = __bfloat1622float2(q.v[1]);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ inline float4 load4_f32(const __half* p, int64_t i) {
  const auto q = reinterpret_cast<const HalfQuad<__half2>*>(p)[i];
  const float2 a = __half22float2(q.v[0]), b = __half22float2(q.v[1]);
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ inline void store4_f32(float* p, int64_t i, float4 v) {
  reinterpret_cast<float4*>(p)[i] = v;
}
__device__ inline void store4_f32(__nv_bfloat16* p, int64_t i, float4 v) {
  HalfQuad<__nv_bfloat162> q;
  q.v[0] = __floats2bfloat162_rn(v.x, v.y);
  q.v[1] = __floats2bfloat162_rn(v.z, v.w);
  reinterpret_cast<HalfQuad<__nv_bfloat162>*>(p)[i] = q;
}
__device__ inline void store4_f32(__half* p, int64_t i, float4 v) {
  HalfQuad<__half2> q;
  q.v[0] = __floats2half2_rn(v.x, v.y);
  q.v[1] = __floats2half2_rn(v.z, v.w);
  reinterpret_cast<HalfQuad<__half2>*>(p)[i] = q;
}

// Calls f with a null pointer of the element type `type` names (f32, bf16 or f16), so that a host
// function picks a kernel's instantiation once; any other type fails naming `what`.
template <typename F>
void with_float_type(DType type, const char* what, F&& f) {
  switch (type) {
    case DType::f32:
      return f(static_cast<float*>(nullptr));
    case DType::bf16:
      return f(static_cast<__nv_bfloat16*>(nullptr));
    case DType::f16:
      return f(static_cast<__half*>(nullptr));
    default:
      MT_THROW(ValueError, what, " must be f32, bf16 or f16, got ", dtype_name(type));
  }
}

}  // namespace meshtrain::cuda::detail
