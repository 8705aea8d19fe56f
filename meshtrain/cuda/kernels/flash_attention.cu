// Tiles of 64 queries by 64 keys; a block of four warps, each owning 16 rows of its block's tile
// (queries in the forward and the dq kernel, keys in the dk/dv kernel). Products are 16x16x16
// bf16 WMMA fragments on tiles staged in shared memory; the row-wise softmax work is done by
// pairs of lanes on the f32 scores stored back to shared memory (a lane pair per row, each lane
// half of the 64 columns), since WMMA does not say which lane holds which accumulator element.
// The forward's running output lives in shared memory for the same reason: it is rescaled row by
// row when a row's maximum grows. The backward's accumulators need no rescaling and stay in
// registers for the whole loop.
#include <cuda_bf16.h>
#include <mma.h>

#include <cmath>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/flash_attention.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * detail::kWarp;
constexpr int kRows = kTile / kWarps;  // rows of a tile per warp: one fragment high

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

// Leading dimensions, padded against shared-memory bank conflicts. WMMA needs multiples of 8 bf16
// or 4 f32 elements and 32-byte aligned fragment pointers, which these keep for every D that is
// a multiple of 16.
template <int D>
struct Ld {
  static constexpr int h = D + 8;      // bf16 tiles [64][D] of q, k, v, dout
  static constexpr int s = kTile + 4;  // f32 [64][64] scores and score gradients
  static constexpr int p = kTile + 8;  // bf16 [64][64] probabilities and score gradients
  static constexpr int o = D + 4;      // f32 [64][D] outputs and gradients being written
};

struct Dims {
  int64_t T, C, NH;
  float scale;
};

// One past the last row of the tile that starts at r0.
__device__ inline int64_t last_row(int64_t r0, int64_t T) {
  return r0 + kTile < T ? r0 + kTile : T;
}

// Rows [r0, r0 + 64) of one head's slice (row_stride floats apart) into a bf16 tile; rows past T
// are zeros.
template <int D>
__device__ void load_tile(bf16* dst, const float* src, int64_t row_stride, int64_t r0, int64_t T) {
  for (int i = threadIdx.x; i < kTile * D; i += kThreads) {
    const int r = i / D, d = i % D;
    const int64_t t = r0 + r;
    dst[r * Ld<D>::h + d] = __float2bfloat16(t < T ? src[t * row_stride + d] : 0.0f);
  }
}

// Rows [r0, r0 + 64) of a per-row vector (B * NH * T floats, this head's part at `src`); zeros
// past T.
__device__ void load_rows(float* dst, const float* src, int64_t r0, int64_t T) {
  for (int i = threadIdx.x; i < kTile; i += kThreads) dst[i] = r0 + i < T ? src[r0 + i] : 0.0f;
}

// out[16][64] (f32, ld Ld::s) = a[16][D] @ b[64][D]^T: the warp's rows of a tile times a whole
// tile, transposed.
template <int D>
__device__ void rows_times_tile_t(float* out, const bf16* a, const bf16* b) {
#pragma unroll
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.0f);
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      FragA fa;
      FragBt fb;
      wmma::load_matrix_sync(fa, a + k * 16, Ld<D>::h);
      wmma::load_matrix_sync(fb, b + n * 16 * Ld<D>::h + k * 16, Ld<D>::h);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(out + n * 16, acc, Ld<D>::s, wmma::mem_row_major);
  }
}

// acc[n] += a[16][64] (bf16, ld Ld::p) @ b[64][D] (bf16, ld Ld::h), for the D / 16 column blocks.
template <int D>
__device__ void accumulate_rows_times_tile(FragC* acc, const bf16* a, const bf16* b) {
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
#pragma unroll
    for (int k = 0; k < kTile / 16; ++k) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, a + k * 16, Ld<D>::p);
      wmma::load_matrix_sync(fb, b + k * 16 * Ld<D>::h + n * 16, Ld<D>::h);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// Writes the warp's 16 rows of acc (times `scale`) to global rows dst + (r0 + row) * row_stride,
// rows past T left out; staging is the warp's [16][D] f32 part of a shared buffer.
template <int D>
__device__ void store_rows(float* dst, int64_t row_stride, int64_t r0, int64_t T, FragC* acc,
                           float scale, float* staging) {
  const int lane = threadIdx.x % detail::kWarp;
#pragma unroll
  for (int n = 0; n < D / 16; ++n)
    wmma::store_matrix_sync(staging + n * 16, acc[n], Ld<D>::o, wmma::mem_row_major);
  __syncwarp();
  for (int r = 0; r < kRows; ++r) {
    if (r0 + r >= T) break;
    for (int d = lane; d < D; d += detail::kWarp)
      dst[(r0 + r) * row_stride + d] = staging[r * Ld<D>::o + d] * scale;
  }
  __syncwarp();
}

template <int D>
constexpr size_t forward_smem() {
  return 3 * kTile * Ld<D>::h * sizeof(bf16) + kTile * Ld<D>::p * sizeof(bf16) +
         kTile * Ld<D>::s * sizeof(float) + kTile * Ld<D>::o * sizeof(float) +
         kTile * sizeof(float);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(float* out, float* lse, const float* qkv, Dims dm) {
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sK = sQ + kTile * Ld<D>::h;
  bf16* sV = sK + kTile * Ld<D>::h;
  bf16* sP = sV + kTile * Ld<D>::h;
  float* sS = reinterpret_cast<float*>(sP + kTile * Ld<D>::p);
  float* sO = sS + kTile * Ld<D>::s;
  float* sL = sO + kTile * Ld<D>::o;

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int64_t bh = blockIdx.y, b = bh / dm.NH, h = bh % dm.NH;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;  // longest first
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * D;
  load_tile<D>(sQ, base, C3, q0, dm.T);
  for (int i = threadIdx.x; i < kTile * Ld<D>::o; i += kThreads) sO[i] = 0.0f;

  // This lane's row (a pair of lanes per row) and its half of the columns.
  const int r = warp * kRows + lane / 2;
  const int half = lane % 2;
  const int64_t t = q0 + r;
  float* srow = sS + r * Ld<D>::s + half * 32;
  bf16* prow = sP + r * Ld<D>::p + half * 32;
  float* orow = sO + r * Ld<D>::o + half * (D / 2);
  float m = -INFINITY, l = 0.0f;
  const int64_t key_tiles = (last_row(q0, dm.T) - 1) / kTile + 1;
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // the previous tile's k and v are no longer read (and sQ, sO are ready)
    load_tile<D>(sK, base + dm.C, C3, k0, dm.T);
    load_tile<D>(sV, base + 2 * dm.C, C3, k0, dm.T);
    __syncthreads();
    rows_times_tile_t<D>(sS + warp * kRows * Ld<D>::s, sQ + warp * kRows * Ld<D>::h, sK);
    __syncwarp();
    float mx = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      const int64_t key = k0 + half * 32 + c;
      const float s = key <= t && key < dm.T ? srow[c] * dm.scale : -INFINITY;
      srow[c] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m, mx);
    float alpha = 1.0f, sum = 0.0f;
    if (m_new == -INFINITY) {  // a row past T: nothing to attend to
      for (int c = 0; c < 32; ++c) prow[c] = __float2bfloat16(0.0f);
    } else {
      alpha = expf(m - m_new);
      for (int c = 0; c < 32; ++c) {
        const float p = expf(srow[c] - m_new);
        sum += p;
        prow[c] = __float2bfloat16(p);
      }
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l = l * alpha + sum;
    m = m_new;
    for (int d = 0; d < D / 2; ++d) orow[d] *= alpha;
    __syncwarp();
    FragC acc[D / 16];
    float* o_warp = sO + warp * kRows * Ld<D>::o;
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::load_matrix_sync(acc[n], o_warp + n * 16, Ld<D>::o, wmma::mem_row_major);
    accumulate_rows_times_tile<D>(acc, sP + warp * kRows * Ld<D>::p, sV);
#pragma unroll
    for (int n = 0; n < D / 16; ++n)
      wmma::store_matrix_sync(o_warp + n * 16, acc[n], Ld<D>::o, wmma::mem_row_major);
    __syncwarp();
  }
  if (half == 0) {
    sL[r] = l > 0.0f ? 1.0f / l : 0.0f;
    if (t < dm.T) lse[bh * dm.T + t] = m + logf(l);
  }
  __syncwarp();
  for (int rr = warp * kRows; rr < (warp + 1) * kRows; ++rr) {
    if (q0 + rr >= dm.T) break;
    float* o = out + (b * dm.T + q0 + rr) * dm.C + h * D;
    for (int d = lane; d < D; d += detail::kWarp) o[d] = sO[rr * Ld<D>::o + d] * sL[rr];
  }
}

// dsum[b, h, t] = dout[b, t, h, :] . out[b, t, h, :]: one warp per row of one head.
__global__ void flash_backward_dot_kernel(float* dsum, const float* dout, const float* out, Dims dm,
                                          int D, int64_t rows) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % detail::kWarp;
  const int64_t h = row % dm.NH, bt = row / dm.NH, b = bt / dm.T, t = bt % dm.T;
  const float* g = dout + bt * dm.C + h * D;
  const float* o = out + bt * dm.C + h * D;
  float s = 0.0f;
  for (int d = lane; d < D; d += detail::kWarp) s += g[d] * o[d];
  s = detail::warp_sum(s);
  if (lane == 0) dsum[(b * dm.NH + h) * dm.T + t] = s;
}

template <int D>
constexpr size_t backward_smem() {
  return 4 * kTile * Ld<D>::h * sizeof(bf16) + 2 * kTile * Ld<D>::s * sizeof(float) +
         2 * kTile * Ld<D>::p * sizeof(bf16) + kTile * Ld<D>::o * sizeof(float) +
         2 * kTile * sizeof(float);
}

// The shared-memory layout of both backward kernels.
template <int D>
struct BackwardSmem {
  bf16 *q, *k, *v, *dout, *p, *ds;
  float *s, *dp, *staging, *lse, *dsum;
  __device__ explicit BackwardSmem(unsigned char* smem) {
    q = reinterpret_cast<bf16*>(smem);
    k = q + kTile * Ld<D>::h;
    v = k + kTile * Ld<D>::h;
    dout = v + kTile * Ld<D>::h;
    p = dout + kTile * Ld<D>::h;
    ds = p + kTile * Ld<D>::p;
    s = reinterpret_cast<float*>(ds + kTile * Ld<D>::p);
    dp = s + kTile * Ld<D>::s;
    staging = dp + kTile * Ld<D>::s;
    lse = staging + kTile * Ld<D>::o;
    dsum = lse + kTile;
  }
};

// The probabilities and score gradients of the lane's half row, from the scores and dout . v
// products stored by the warp: p = exp(scale * s - lse) where the key is visible to the query,
// ds = p * (dp - dsum). The tile is [rows][64 columns]; `transposed` says rows are keys.
template <int D>
__device__ void probabilities(const BackwardSmem<D>& sm, int r, int half, int64_t row0,
                              int64_t col0, bool transposed, Dims dm) {
  const float* srow = sm.s + r * Ld<D>::s + half * 32;
  const float* dprow = sm.dp + r * Ld<D>::s + half * 32;
  bf16* prow = sm.p + r * Ld<D>::p + half * 32;
  bf16* dsrow = sm.ds + r * Ld<D>::p + half * 32;
  for (int c = 0; c < 32; ++c) {
    const int64_t row = row0 + r, col = col0 + half * 32 + c;
    const int64_t query = transposed ? col : row, key = transposed ? row : col;
    const int qi = static_cast<int>(transposed ? half * 32 + c : r);  // the query's row in lse
    float p = 0.0f, ds = 0.0f;
    if (key <= query && query < dm.T) {
      p = expf(srow[c] * dm.scale - sm.lse[qi]);
      ds = p * (dprow[c] - sm.dsum[qi]);
    }
    prow[c] = __float2bfloat16(p);
    dsrow[c] = __float2bfloat16(ds);
  }
}

// Block (key tile, b * NH + h): dk and dv of 64 keys, summed over every query tile that sees them.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* dsum, Dims dm) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<D> sm(smem);
  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int64_t bh = blockIdx.y, b = bh / dm.NH, h = bh % dm.NH;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;  // the most work first
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * D;
  const float* gbase = dout + b * dm.T * dm.C + h * D;
  load_tile<D>(sm.k, base + dm.C, C3, k0, dm.T);
  load_tile<D>(sm.v, base + 2 * dm.C, C3, k0, dm.T);
  FragC dk[D / 16], dv[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk[n], 0.0f);
    wmma::fill_fragment(dv[n], 0.0f);
  }
  const int r = warp * kRows + lane / 2, half = lane % 2;
  const int64_t query_tiles = (dm.T - 1) / kTile + 1;
  for (int64_t qt = k0 / kTile; qt < query_tiles; ++qt) {
    const int64_t q0 = qt * kTile;
    __syncthreads();  // the previous query tile is no longer read
    load_tile<D>(sm.q, base, C3, q0, dm.T);
    load_tile<D>(sm.dout, gbase, dm.C, q0, dm.T);
    load_rows(sm.lse, lse + bh * dm.T, q0, dm.T);
    load_rows(sm.dsum, dsum + bh * dm.T, q0, dm.T);
    __syncthreads();
    // Transposed tiles: the warp's 16 keys by the 64 queries.
    rows_times_tile_t<D>(sm.s + warp * kRows * Ld<D>::s, sm.k + warp * kRows * Ld<D>::h, sm.q);
    rows_times_tile_t<D>(sm.dp + warp * kRows * Ld<D>::s, sm.v + warp * kRows * Ld<D>::h, sm.dout);
    __syncwarp();
    probabilities<D>(sm, r, half, k0, q0, true, dm);
    __syncwarp();
    accumulate_rows_times_tile<D>(dv, sm.p + warp * kRows * Ld<D>::p, sm.dout);
    accumulate_rows_times_tile<D>(dk, sm.ds + warp * kRows * Ld<D>::p, sm.q);
  }
  float* staging = sm.staging + warp * kRows * Ld<D>::o;
  float* dbase = dqkv + b * dm.T * C3 + h * D;
  const int64_t r0 = k0 + warp * kRows;
  store_rows<D>(dbase + dm.C, C3, r0, dm.T, dk, dm.scale, staging);
  store_rows<D>(dbase + 2 * dm.C, C3, r0, dm.T, dv, 1.0f, staging);
}

// Block (query tile, b * NH + h): dq of 64 queries, summed over the key tiles they see.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_q_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                            const float* dsum, Dims dm) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<D> sm(smem);
  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int64_t bh = blockIdx.y, b = bh / dm.NH, h = bh % dm.NH;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;  // longest first
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * D;
  load_tile<D>(sm.q, base, C3, q0, dm.T);
  load_tile<D>(sm.dout, dout + b * dm.T * dm.C + h * D, dm.C, q0, dm.T);
  load_rows(sm.lse, lse + bh * dm.T, q0, dm.T);
  load_rows(sm.dsum, dsum + bh * dm.T, q0, dm.T);
  FragC dq[D / 16];
#pragma unroll
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq[n], 0.0f);
  const int r = warp * kRows + lane / 2, half = lane % 2;
  const int64_t key_tiles = (last_row(q0, dm.T) - 1) / kTile + 1;
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();
    load_tile<D>(sm.k, base + dm.C, C3, k0, dm.T);
    load_tile<D>(sm.v, base + 2 * dm.C, C3, k0, dm.T);
    __syncthreads();
    rows_times_tile_t<D>(sm.s + warp * kRows * Ld<D>::s, sm.q + warp * kRows * Ld<D>::h, sm.k);
    rows_times_tile_t<D>(sm.dp + warp * kRows * Ld<D>::s, sm.dout + warp * kRows * Ld<D>::h, sm.v);
    __syncwarp();
    probabilities<D>(sm, r, half, q0, k0, false, dm);
    __syncwarp();
    accumulate_rows_times_tile<D>(dq, sm.ds + warp * kRows * Ld<D>::p, sm.k);
  }
  store_rows<D>(dqkv + b * dm.T * C3 + h * D, C3, q0 + warp * kRows, dm.T, dq, dm.scale,
                sm.staging + warp * kRows * Ld<D>::o);
}

Dims make_dims(int64_t T, int64_t C, int64_t NH) {
  MT_CHECK(NH > 0 && C % NH == 0, "flash attention: C=", C, " is not divisible by NH=", NH);
  MT_CHECK(flash_attention_supports(C / NH), "flash attention: head size ", C / NH,
           " is not supported (32, 64 or 128)");
  return Dims{T, C, NH, 1.0f / std::sqrt(static_cast<float>(C / NH))};
}

template <typename Kernel>
void allow_smem(Kernel kernel, size_t bytes) {
  MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     static_cast<int>(bytes)));
}

template <int D>
void forward_for(float* out, float* lse, const float* qkv, int64_t B, Dims dm,
                 cudaStream_t stream) {
  constexpr size_t bytes = forward_smem<D>();
  allow_smem(flash_forward_kernel<D>, bytes);
  const dim3 grid(static_cast<unsigned>((dm.T + kTile - 1) / kTile),
                  static_cast<unsigned>(B * dm.NH));
  flash_forward_kernel<D><<<grid, kThreads, bytes, stream>>>(out, lse, qkv, dm);
  MT_CUDA_CHECK_LAUNCH();
}

template <int D>
void backward_for(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                  const float* lse, int64_t B, Dims dm, cudaStream_t stream) {
  constexpr size_t bytes = backward_smem<D>();
  allow_smem(flash_backward_kv_kernel<D>, bytes);
  allow_smem(flash_backward_q_kernel<D>, bytes);
  const dim3 grid(static_cast<unsigned>((dm.T + kTile - 1) / kTile),
                  static_cast<unsigned>(B * dm.NH));
  flash_backward_kv_kernel<D><<<grid, kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, dsum, dm);
  MT_CUDA_CHECK_LAUNCH();
  flash_backward_q_kernel<D><<<grid, kThreads, bytes, stream>>>(dqkv, dout, qkv, lse, dsum, dm);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

bool flash_attention_supports(int64_t head_size) {
  return head_size == 32 || head_size == 64 || head_size == 128;
}

void flash_attention_forward(float* out, float* lse, const float* qkv, int64_t B, int64_t T,
                             int64_t C, int64_t NH, cudaStream_t stream) {
  const Dims dm = make_dims(T, C, NH);
  if (B <= 0 || T <= 0) return;
  switch (C / NH) {
    case 32:
      return forward_for<32>(out, lse, qkv, B, dm, stream);
    case 64:
      return forward_for<64>(out, lse, qkv, B, dm, stream);
    default:
      return forward_for<128>(out, lse, qkv, B, dm, stream);
  }
}

void flash_attention_backward(float* dqkv, float* scratch, const float* dout, const float* qkv,
                              const float* out, const float* lse, int64_t B, int64_t T, int64_t C,
                              int64_t NH, cudaStream_t stream) {
  const Dims dm = make_dims(T, C, NH);
  if (B <= 0 || T <= 0) return;
  const int D = static_cast<int>(C / NH);
  const int64_t rows = B * T * NH;
  constexpr int kDotBlock = 256;
  const auto blocks =
      static_cast<unsigned>((rows + kDotBlock / detail::kWarp - 1) / (kDotBlock / detail::kWarp));
  flash_backward_dot_kernel<<<blocks, kDotBlock, 0, stream>>>(scratch, dout, out, dm, D, rows);
  MT_CUDA_CHECK_LAUNCH();
  switch (D) {
    case 32:
      return backward_for<32>(dqkv, scratch, dout, qkv, lse, B, dm, stream);
    case 64:
      return backward_for<64>(dqkv, scratch, dout, qkv, lse, B, dm, stream);
    default:
      return backward_for<128>(dqkv, scratch, dout, qkv, lse, B, dm, stream);
  }
}

}  // namespace meshtrain::cuda
