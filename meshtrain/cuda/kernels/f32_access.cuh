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
