// Same formulation as the CPU kernel: 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)), with the
// exponent clamped so that neither side overflows. Under autocast the input is rounded to the half
// type in the same pass that computes the forward, and the backward reads that half copy: four
// elements per thread (16-byte f32 and 8-byte half accesses) where the arrays allow, one
// otherwise, the same arithmetic either way.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <type_traits>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/elementwise_map.cuh"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/gelu.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

__device__ inline float half_one_plus_tanh(float x) {
  const float u = kSqrt2OverPi * (x + kCubic * x * x * x);
  return 1.0f / (1.0f + expf(fminf(fmaxf(-2.0f * u, -87.5f), 88.72283f)));
}

struct GeluForward {
  __device__ float operator()(float x) const { return x * half_one_plus_tanh(x); }
};

struct GeluBackward {
  __device__ float operator()(float x, float dout) const {
    const float s = half_one_plus_tanh(x);
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
    return (s + 2.0f * x * s * (1.0f - s) * du) * dout;
  }
};

// Pairs of half values: two roundings into one 4-byte word and back.
template <typename H>
struct HalfPair;
template <>
struct HalfPair<__nv_bfloat16> {
  using T2 = __nv_bfloat162;
  __device__ static T2 pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
  __device__ static float2 unpack(T2 v) { return __bfloat1622float2(v); }
};
template <>
struct HalfPair<__half> {
  using T2 = __half2;
  __device__ static T2 pack(float a, float b) { return __floats2half2_rn(a, b); }
  __device__ static float2 unpack(T2 v) { return __half22float2(v); }
};

#define MT_GRID_STRIDE(i, n)                                                \
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < (n); \
       i += int64_t{gridDim.x} * blockDim.x)

// O is float or H: the output in f32 or rounded like the input.
template <typename H, typename O>
__global__ void gelu_forward_half_kernel(O* out, H* inp_half, const float* inp, int64_t n) {
  MT_GRID_STRIDE(i, n) {
    detail::store_f32(inp_half, i, inp[i]);
    detail::store_f32(out, i, GeluForward{}(detail::load_f32(inp_half, i)));
  }
}

template <typename H>
__device__ inline void store4(float4* out, int64_t i, float a, float b, float c, float d) {
  out[i] = make_float4(a, b, c, d);
}
template <typename H>
__device__ inline void store4(typename HalfPair<H>::T2* out, int64_t i, float a, float b, float c,
                              float d) {
  out[2 * i] = HalfPair<H>::pack(a, b);
  out[2 * i + 1] = HalfPair<H>::pack(c, d);
}

// O4 is float4 (f32 output) or the half pair type (two pairs per four elements).
template <typename H, typename O4>
__global__ void gelu_forward_half_x4_kernel(O4* out, typename HalfPair<H>::T2* inp_half,
                                            const float4* inp, int64_t n4) {
  using P = HalfPair<H>;
  MT_GRID_STRIDE(i, n4) {
    const float4 x = inp[i];
    const typename P::T2 lo = P::pack(x.x, x.y), hi = P::pack(x.z, x.w);
    inp_half[2 * i] = lo;
    inp_half[2 * i + 1] = hi;
    const float2 a = P::unpack(lo), b = P::unpack(hi);
    const GeluForward f;
    store4<H>(out, i, f(a.x), f(a.y), f(b.x), f(b.y));
  }
}

template <typename H>
__global__ void gelu_backward_half_kernel(float* dinp, const H* inp, const float* dout, int64_t n) {
  MT_GRID_STRIDE(i, n) dinp[i] = GeluBackward{}(detail::load_f32(inp, i), dout[i]);
}

template <typename H>
__global__ void gelu_backward_half_x4_kernel(float4* dinp, const typename HalfPair<H>::T2* inp,
                                             const float4* dout, int64_t n4) {
  using P = HalfPair<H>;
  MT_GRID_STRIDE(i, n4) {
    const float2 a = P::unpack(inp[2 * i]), b = P::unpack(inp[2 * i + 1]);
    const float4 d = dout[i];
    const GeluBackward f;
    dinp[i] = make_float4(f(a.x, d.x), f(a.y, d.y), f(b.x, d.z), f(b.y, d.w));
  }
}

#undef MT_GRID_STRIDE

template <typename H, typename O>
void forward_half(void* out, void* inp_half, const float* inp, int64_t n, cudaStream_t stream) {
  using T2 = typename HalfPair<H>::T2;
  using O4 = std::conditional_t<std::is_same_v<O, float>, float4, T2>;
  if (n % 4 == 0 && detail::aligned16(out) && detail::aligned16(inp) &&
      detail::aligned16(inp_half)) {
    gelu_forward_half_x4_kernel<H, O4><<<detail::grid_for(n / 4), detail::kBlock, 0, stream>>>(
        static_cast<O4*>(out), static_cast<T2*>(inp_half), reinterpret_cast<const float4*>(inp),
        n / 4);
  } else {
    gelu_forward_half_kernel<H, O><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
        static_cast<O*>(out), static_cast<H*>(inp_half), inp, n);
  }
  MT_CUDA_CHECK_LAUNCH();
}

template <typename H>
void forward_half(void* out, DType out_type, DType half, void* inp_half, const float* inp,
                  int64_t n, cudaStream_t stream) {
  MT_CHECK(out_type == DType::f32 || out_type == half, "gelu: the output is f32 or ",
           dtype_name(half), ", got ", dtype_name(out_type));
  if (out_type == DType::f32) return forward_half<H, float>(out, inp_half, inp, n, stream);
  forward_half<H, H>(out, inp_half, inp, n, stream);
}

template <typename H>
void backward_half(float* dinp, const void* inp, const float* dout, int64_t n,
                   cudaStream_t stream) {
  using T2 = typename HalfPair<H>::T2;
  if (n % 4 == 0 && detail::aligned16(dinp) && detail::aligned16(inp) && detail::aligned16(dout)) {
    gelu_backward_half_x4_kernel<H><<<detail::grid_for(n / 4), detail::kBlock, 0, stream>>>(
        reinterpret_cast<float4*>(dinp), static_cast<const T2*>(inp),
        reinterpret_cast<const float4*>(dout), n / 4);
  } else {
    gelu_backward_half_kernel<H><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
        dinp, static_cast<const H*>(inp), dout, n);
  }
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gelu_forward(float* out, const float* inp, int64_t n, cudaStream_t stream) {
  detail::map(out, inp, n, GeluForward{}, stream);
}

void gelu_forward_half(void* out, DType out_type, void* inp_half, const float* inp, DType half,
                       int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  switch (half) {
    case DType::bf16:
      return forward_half<__nv_bfloat16>(out, out_type, half, inp_half, inp, n, stream);
    case DType::f16:
      return forward_half<__half>(out, out_type, half, inp_half, inp, n, stream);
    default:
      MT_THROW(ValueError, "gelu: the half type must be bf16 or f16, got ", dtype_name(half));
  }
}

void gelu_backward(float* dinp, const void* inp, DType inp_type, const float* dout, int64_t n,
                   cudaStream_t stream) {
  if (n <= 0) return;
  switch (inp_type) {
    case DType::f32:
      return detail::map(dinp, static_cast<const float*>(inp), dout, n, GeluBackward{}, stream);
    case DType::bf16:
      return backward_half<__nv_bfloat16>(dinp, inp, dout, n, stream);
    case DType::f16:
      return backward_half<__half>(dinp, inp, dout, n, stream);
    default:
      MT_THROW(ValueError, "gelu: the input must be f32, bf16 or f16, got ", dtype_name(inp_type));
  }
}

}  // namespace meshtrain::cuda
