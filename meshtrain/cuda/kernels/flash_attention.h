// Causal attention without the T x T matrix in memory (FlashAttention-2's algorithm), for
// autocast: q, k and v come packed in bf16 or f16 (the copy autograd rounds once and keeps for the
// backward), the products run on tensor cores in that type with f32 accumulation, the softmax is
// f32. The
// forward keeps only the logsumexp of each row (B * NH * T floats) for the backward, which
// recomputes the probabilities tile by tile. Memory is O(T), not O(T^2).
//
// The backward is two kernels so that no gradient needs atomics (the result is the same on every
// run): one owns a tile of keys and sums dk and dv over the queries that see it, the other owns a
// tile of queries and sums dq over the keys it sees; each recomputes the scores it needs. A
// variant (set_flash_backward_atomic_dq) has the first add its part of dq with atomics instead.
//
// Numerics: those of a half product with f32 accumulation (the probabilities before the product
// with v and the score gradient are rounded to the half type for the tensor cores, as in
// FlashAttention-2 and PyTorch's scaled_dot_product_attention under autocast), so results follow
// the f32 reference within half-precision tolerance, not bit for bit. Under f16 the gradients
// are those of a loss scaled up (f16's loss scaling): an overflow gives infinities, which the
// scaler's check of the gradients sees. The reference stays attention.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::cuda {

// The backward's dq in the key-side kernel's pass, added over key tiles with atomics
// (FlashAttention-2's way: five products a pair of tiles instead of seven, no dq kernel), instead
// of a kernel of its own that recomputes the scores: off by default, since the sums' order then
// varies from run to run (dk and dv keep their bits); a process-wide switch for benchmarks to time
// one against the other.
void set_flash_backward_atomic_dq(bool atomic);
bool flash_backward_atomic_dq();

// Whether the kernels handle this head size (32, 64 or 128: flash_attention_head_size).
bool flash_attention_supports(int64_t head_size);

// out[B, T, C] from qkv[B, T, 3C] in `half` (bf16 or f16; the layout of attention.h) and
// lse[B, NH, T], the logsumexp of each row of scaled scores. out is f32 or `half` (out_type:
// rounded once, for a half product, and then the copy the backward reads). warp_rows: the query
// rows a warp owns, 16 (four warps a block), or 32 for heads of 32 and 64 (two warps a block, each
// key and value operand loaded from shared memory once for two fragments; heads of 128 take 16):
// the same values. 0: whichever of the two is faster for this shape, timed on the first call with
// it (a wait for the device, once a shape) after checking that both give the same bits.
void flash_attention_forward(void* out, DType out_type, float* lse, const void* qkv, DType half,
                             int64_t B, int64_t T, int64_t C, int64_t NH, cudaStream_t stream,
                             int warp_rows = 16);

// What the forward's layout tuning (warp_rows 0) chose for each shape and the timings it chose
// by, one line a shape: for a benchmark to report beside its figures.
std::vector<std::string> flash_forward_tuning();

// Writes dqkv[B, T, 3C] (f32 or `half`: dqkv_type) from dout[B, T, C] and the forward's qkv
// (in `half`), out and lse; dout and out are both of out_type (f32 or `half`: an output's
// gradient has its type). scratch holds B * NH * T floats (the row sums of dout * out).
void flash_attention_backward(void* dqkv, DType dqkv_type, float* scratch, const void* dout,
                              const void* qkv, DType half, const void* out, DType out_type,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                              cudaStream_t stream);

}  // namespace meshtrain::cuda
