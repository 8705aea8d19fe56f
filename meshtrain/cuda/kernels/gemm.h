// Matrix products on the device through cuBLASLt, with the row-major conventions of
// tensor/cpu/gemm.h. f32, bf16 and f16 operands all accumulate in f32; f32 products are exact
// fp32 (the CPU reference's precision) unless TF32 is allowed. The bias epilogue adds a row
// vector in the same kernel, saving a pass over the output.
//
// The bias gradient and GELU's two directions can also be taken from where the product writes
// (cuBLASLt's BGRADB, GELU_AUX_BIAS and DGELU_BGRAD epilogues), each with a way round of separate
// kernels where cuBLASLt has no kernel for it, or where set_fused_epilogues(false) asks for that.
//
// Row-major out[M, N] = op(a) @ op(b) is column-major out^T = op(b)^T @ op(a)^T, so cuBLASLt is
// called with the operands swapped and no data is transposed.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// Lets f32 products use TF32 tensor cores (about 8x faster, 10-bit mantissa products). Off by
// default; a process-wide switch, as in PyTorch.
void set_allow_tf32(bool allow);
bool allow_tf32();

// Lets a product compute the bias gradient and GELU where it writes (on by default; off: the
// same values from separate kernels, summed in their own order, to time one against the other).
void set_fused_epilogues(bool fused);
bool fused_epilogues();

struct GemmShape {
  int64_t M = 0, N = 0, K = 0;
  bool trans_a = false;  // a is stored [K, M] instead of [M, K]
  bool trans_b = false;  // b is stored [N, K] instead of [K, N]
  // Batched products: batch matrices stride_* elements apart (0 for b shares one matrix).
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_out = 0;
  // The output (and bias) in f32 while a and b are bf16/f16: the mixed-precision product of
  // autocast (half operands, f32 accumulation and result).
  bool f32_out = false;
  // With a half output: the bias in f32 all the same (autocast's linear handing a half consumer
  // its output: the f32 master bias added to the f32 sum, one rounding). Where cuBLASLt has no
  // such kernel, the product goes through an f32 output and a cast, with the same result.
  bool f32_bias = false;
};

// The shape of `batch` products of [M, K] by [K, N] (op as trans_*), the outputs contiguous.
inline GemmShape gemm_shape(int64_t M, int64_t N, int64_t K, bool trans_a = false,
                            bool trans_b = false, int64_t batch = 1, int64_t stride_a = 0,
                            int64_t stride_b = 0) {
  GemmShape g;
  g.M = M;
  g.N = N;
  g.K = K;
  g.trans_a = trans_a;
  g.trans_b = trans_b;
  g.batch = batch;
  g.stride_a = stride_a;
  g.stride_b = stride_b;
  g.stride_out = M * N;
  return g;
}

// out = alpha * op(a) @ op(b) + beta * c (+ bias[N] broadcast over rows when bias is not null);
// c is out itself when null, else a matrix of out's type and layout (read, not written: a residual
// the product's output joins, summed where the output is written). a, b, out and bias share
// `dtype` (f32, bf16 or f16), unless shape.f32_out makes out and bias f32. Runs on `stream`; its
// workspace comes from the device's caching allocator.
void matmul(void* out, const void* a, const void* b, const void* bias, DType dtype,
            const GemmShape& shape, float alpha, float beta, cudaStream_t stream,
            const void* c = nullptr);

// A weight gradient and its bias gradient: out[M, N] = a^T @ op(b) with a stored [K, M]
// (shape.trans_a; one product with an f32 output: dtype f32 or shape.f32_out), written, and
// dbias[M] (f32, may be null) = the sums over a's K rows (dout's column sums), written. Where
// cuBLASLt sums them in the product's epilogue, a is read once.
void matmul_bias_grad(void* out, float* dbias, const void* a, const void* b, DType dtype,
                      const GemmShape& shape, cudaStream_t stream);

// GELU where the product is written: pre[M, N] = op(a) @ op(b) + bias[N] (f32, may be null)
// rounded to dtype (a half type; GELU's input, kept for its backward), and out[M, N] = gelu of
// the unrounded sum, rounded once (cuBLASLt's GELU_AUX_BIAS epilogue; the tanh form). One
// product, both written.
void matmul_gelu(void* out, void* pre, const void* a, const void* b, const float* bias, DType dtype,
                 const GemmShape& shape, cudaStream_t stream);
// GELU's backward where the product is written: out[M, N] = gelu'(pre) * (op(a) @ op(b)), the f32
// product's, rounded once to dtype (a half type, as pre [M, N]); dbias[N] (f32, may be null) =
// the sums of out's rows, written (cuBLASLt's DGELU_BGRAD epilogue: the bias gradient of the
// product whose output went through GELU). One product.
void matmul_dgelu(void* out, float* dbias, const void* a, const void* b, const void* pre,
                  DType dtype, const GemmShape& shape, cudaStream_t stream);

// The fused forms that took their way round in this process (cuBLASLt had no kernel for them),
// one line each: for a benchmark to report beside its figures.
std::vector<std::string> epilogue_fallbacks();

// nn.Linear: out[BT, C_out] = inp[BT, C_in] @ weight[C_out, C_in]^T + bias[C_out] (bias may be
// null), plus residual[BT, C_out] where it is not null.
void linear_forward(void* out, const void* inp, const void* weight, const void* bias, DType dtype,
                    int64_t BT, int64_t C_in, int64_t C_out, cudaStream_t stream,
                    const void* residual = nullptr);

// Accumulates dinp += dout @ weight and dweight += dout^T @ inp; dbias (f32 only) += column sums
// of dout. Each of dinp, dweight, dbias may be null.
void linear_backward(void* dinp, void* dweight, float* dbias, const void* dout, const void* inp,
                     const void* weight, DType dtype, int64_t BT, int64_t C_in, int64_t C_out,
                     cudaStream_t stream);

}  // namespace meshtrain::cuda
