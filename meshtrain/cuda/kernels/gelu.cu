// The CPU kernel's formulation: 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)), with the exponent
// clamped so that neither side overflows; not its bits (expf here, a polynomial there, and the
// product by the reciprocal where the CPU divides): a few ulps apart, NaN and infinities alike.
// Every array is f32, bf16 or f16 (autocast's half activations and their half gradients), read
// widened and computed in f32: four elements per thread (16-byte f32 and 8-byte half accesses)
// where the arrays allow, one otherwise, the same arithmetic either way.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/elementwise_map.cuh"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/gelu.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;

// exp's largest finite argument: past it GELU is -0 with a derivative of 0 (the CPU's kTop).
constexpr float kTop = 88.72283f;

// -2u, the exponent of 0.5 * (1 + tanh(u)) = 1 / (1 + exp(-2u)).
__device__ inline float exponent_of(float x) {
  return -2.0f * (kSqrt2OverPi * (x + kCubic * x * x * x));
}

// The clamp keeps a NaN (fmaxf would turn it into -87.5, and then s = 1), as the CPU's clamp_to.
__device__ inline float half_one_plus_tanh(float t) {
  return 1.0f / (1.0f + expf(t < -87.5f ? -87.5f : (t > kTop ? kTop : t)));
}

__device__ inline float gelu(float x) {
  const float t = exponent_of(x);
  return t > kTop ? -0.0f : x * half_one_plus_tanh(t);
}

// Saturated factors (s exactly 1, or t past the clamp) give the derivative s itself: their
// product with an overflowed du would be NaN or inf.
__device__ inline float gelu_grad(float x, float dout) {
  const float t = exponent_of(x);
  const float s = half_one_plus_tanh(t);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kCubic * x * x);
  const float grad = s + 2.0f * x * s * (1.0f - s) * du;
  return (t > kTop ? 0.0f : (s == 1.0f ? 1.0f : grad)) * dout;
}

template <typename O, typename I>
__global__ void gelu_forward_kernel(O* out, const I* inp, int64_t n) {
  MT_GRID_STRIDE(i, n) detail::store_f32(out, i, gelu(detail::load_f32(inp, i)));
}

template <typename O, typename I>
__global__ void gelu_forward_x4_kernel(O* out, const I* inp, int64_t n4) {
  MT_GRID_STRIDE(i, n4) {
    const float4 x = detail::load4_f32(inp, i);
    detail::store4_f32(out, i, make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w)));
  }
}

// H is the half type of the rounded copy; O is f32 or H. kOfRounded: GELU of the rounded copy
// (autocast's GELU of an f32 input), else of the f32 input itself (a product's epilogue).
template <typename O, typename H, bool kOfRounded>
__global__ void gelu_forward_half_kernel(O* out, H* inp_half, const float* inp, int64_t n) {
  MT_GRID_STRIDE(i, n) {
    detail::store_f32(inp_half, i, inp[i]);
    detail::store_f32(out, i, gelu(kOfRounded ? detail::load_f32(inp_half, i) : inp[i]));
  }
}

template <typename O, typename H, bool kOfRounded>
__global__ void gelu_forward_half_x4_kernel(O* out, H* inp_half, const float* inp, int64_t n4) {
  MT_GRID_STRIDE(i, n4) {
    const float4 f = detail::load4_f32(inp, i);
    detail::store4_f32(inp_half, i, f);
    const float4 x = kOfRounded ? detail::load4_f32(inp_half, i) : f;
    detail::store4_f32(out, i, make_float4(gelu(x.x), gelu(x.y), gelu(x.z), gelu(x.w)));
  }
}

template <typename DI, typename I, typename DO>
__global__ void gelu_backward_kernel(DI* dinp, const I* inp, const DO* dout, int64_t n) {
  MT_GRID_STRIDE(i, n) {
    detail::store_f32(dinp, i, gelu_grad(detail::load_f32(inp, i), detail::load_f32(dout, i)));
  }
}

template <typename DI, typename I, typename DO>
__global__ void gelu_backward_x4_kernel(DI* dinp, const I* inp, const DO* dout, int64_t n4) {
  MT_GRID_STRIDE(i, n4) {
    const float4 x = detail::load4_f32(inp, i), d = detail::load4_f32(dout, i);
    detail::store4_f32(dinp, i,
                       make_float4(gelu_grad(x.x, d.x), gelu_grad(x.y, d.y), gelu_grad(x.z, d.z),
                                   gelu_grad(x.w, d.w)));
  }
}

}  // namespace

void gelu_forward(void* out, DType out_type, const void* inp, DType inp_type, int64_t n,
                  cudaStream_t stream) {
  if (n <= 0) return;
  detail::with_float_type(out_type, "gelu's output", [&]<typename O>(O*) {
    detail::with_float_type(inp_type, "gelu's input", [&]<typename I>(I*) {
      if (detail::quads(n, {out, inp})) {
        gelu_forward_x4_kernel<O, I><<<detail::grid_for(n / 4), detail::kBlock, 0, stream>>>(
            static_cast<O*>(out), static_cast<const I*>(inp), n / 4);
      } else {
        gelu_forward_kernel<O, I><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
            static_cast<O*>(out), static_cast<const I*>(inp), n);
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

namespace {

template <bool kOfRounded>
void gelu_forward_with_copy(void* out, DType out_type, void* inp_half, const float* inp, DType half,
                            int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  MT_CHECK(half == DType::bf16 || half == DType::f16,
           "gelu: the half type must be bf16 or f16, got ", dtype_name(half));
  MT_CHECK(out_type == DType::f32 || out_type == half, "gelu: the output is f32 or ",
           dtype_name(half), ", got ", dtype_name(out_type));
  detail::with_float_type(out_type, "gelu's output", [&]<typename O>(O*) {
    detail::with_float_type(half, "gelu's half type", [&]<typename H>(H*) {
      if (detail::quads(n, {out, inp, inp_half})) {
        gelu_forward_half_x4_kernel<O, H, kOfRounded>
            <<<detail::grid_for(n / 4), detail::kBlock, 0, stream>>>(
                static_cast<O*>(out), static_cast<H*>(inp_half), inp, n / 4);
      } else {
        gelu_forward_half_kernel<O, H, kOfRounded>
            <<<detail::grid_for(n), detail::kBlock, 0, stream>>>(static_cast<O*>(out),
                                                                 static_cast<H*>(inp_half), inp, n);
      }
      MT_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace

void gelu_forward_half(void* out, DType out_type, void* inp_half, const float* inp, DType half,
                       int64_t n, cudaStream_t stream) {
  gelu_forward_with_copy<true>(out, out_type, inp_half, inp, half, n, stream);
}

void gelu_forward_keep(void* out, DType out_type, void* inp_half, const float* inp, DType half,
                       int64_t n, cudaStream_t stream) {
  gelu_forward_with_copy<false>(out, out_type, inp_half, inp, half, n, stream);
}

void gelu_backward(void* dinp, DType dinp_type, const void* inp, DType inp_type, const void* dout,
                   DType dout_type, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  detail::with_float_type(dinp_type, "gelu's input gradient", [&]<typename DI>(DI*) {
    detail::with_float_type(inp_type, "gelu's input", [&]<typename I>(I*) {
      detail::with_float_type(dout_type, "gelu's output gradient", [&]<typename DO>(DO*) {
        if (detail::quads(n, {dinp, inp, dout})) {
          gelu_backward_x4_kernel<DI, I, DO>
              <<<detail::grid_for(n / 4), detail::kBlock, 0, stream>>>(
                  static_cast<DI*>(dinp), static_cast<const I*>(inp), static_cast<const DO*>(dout),
                  n / 4);
        } else {
          gelu_backward_kernel<DI, I, DO><<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
              static_cast<DI*>(dinp), static_cast<const I*>(inp), static_cast<const DO*>(dout), n);
        }
        MT_CUDA_CHECK_LAUNCH();
      });
    });
  });
}

}  // namespace meshtrain::cuda
