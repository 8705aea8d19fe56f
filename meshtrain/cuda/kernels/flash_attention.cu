// Tiles of 64 queries by 64 keys; a block of four warps, each owning 16 rows of its block's tile
// (queries in the forward and the dq kernel, keys in the dk/dv kernel). Products are PTX
// mma.sync m16n8k16 bf16 instructions whose fragment layouts are fixed by the ISA, so the scores
// stay in registers: the softmax, the masks and the conversion of probabilities into the next
// product's operand happen where the accumulators are (FlashAttention-2's structure). Each
// thread holds, of a 16 x 8 accumulator tile, rows g = lane / 4 and g + 8 at columns
// 2 * (lane % 4) and the next one; a row's four threads are lanes 4g .. 4g + 3.
//
// Shared memory holds only what several warps read: the other side's tile in bf16, row-major
// for products over the head dimension and transposed for products over the rows (each operand
// pair the instruction takes is then two adjacent bf16 values, one 32-bit load).
#include <cuda_bf16.h>

#include <cmath>
#include <cstdint>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/flash_attention.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

using bf16 = __nv_bfloat16;

constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * detail::kWarp;
constexpr int kRows = kTile / kWarps;  // rows of a tile per warp: one m16 fragment
constexpr float kLog2e = 1.4426950408889634f;

// Leading dimensions (bf16 elements), padded by 8 against bank conflicts.
template <int D>
constexpr int kLdRow = D + 8;    // [64][D] tiles
constexpr int kLdT = kTile + 8;  // [D][64] transposed tiles

struct Dims {
  int64_t T, C, NH;
  float scale;  // 1 / sqrt(head size)
};

__device__ inline uint32_t pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ inline uint32_t ld32(const bf16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a (16 x 16, row-major fragment) * b (16 x 8, column fragment), f32 accumulation.
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// One past the last row of the tile that starts at r0.
__device__ inline int64_t tile_end(int64_t r0, int64_t T) {
  return r0 + kTile < T ? r0 + kTile : T;
}

// The A fragments of rows [row0, row0 + 16) of a head's slice (rows row_stride floats apart,
// rows past T zero): D / 16 fragments over the head dimension, held for a whole kernel.
template <int D>
__device__ void load_a_rows(uint32_t (&a)[D / 16][4], const float* src, int64_t row_stride,
                            int64_t row0, int64_t T) {
  const int lane = threadIdx.x % detail::kWarp, g = lane / 4, c = (lane % 4) * 2;
  auto pair = [&](int64_t r, int col) {
    if (r >= T) return 0u;
    const float* p = src + r * row_stride + col;
    return pack(p[0], p[1]);
  };
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    a[k][0] = pair(row0 + g, k * 16 + c);
    a[k][1] = pair(row0 + g + 8, k * 16 + c);
    a[k][2] = pair(row0 + g, k * 16 + 8 + c);
    a[k][3] = pair(row0 + g + 8, k * 16 + 8 + c);
  }
}

// Rows [r0, r0 + 64) of a head's slice into a row-major bf16 tile [64][D] (rows past T zero).
// Consecutive threads take consecutive groups of four values of a row: coalesced reads.
template <int D>
__device__ void stage_rows(bf16* dst, const float* src, int64_t row_stride, int64_t r0, int64_t T) {
  const bool vec = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && row_stride % 4 == 0;
  for (int i = threadIdx.x; i < kTile * D / 4; i += kThreads) {
    const int r = i / (D / 4), d = (i % (D / 4)) * 4;
    const int64_t t = r0 + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < T) {
      const float* p = src + t * row_stride + d;
      v = vec ? *reinterpret_cast<const float4*>(p) : make_float4(p[0], p[1], p[2], p[3]);
    }
    uint2 packed;
    packed.x = pack(v.x, v.y);
    packed.y = pack(v.z, v.w);
    *reinterpret_cast<uint2*>(dst + r * kLdRow<D> + d) = packed;
  }
}

// The same rows transposed: dst[d][r] ([D][64]). Consecutive threads take consecutive rows, so
// the 2-byte writes of a warp fall in distinct banks.
template <int D>
__device__ void stage_transposed(bf16* dst, const float* src, int64_t row_stride, int64_t r0,
                                 int64_t T) {
  const bool vec = (reinterpret_cast<uintptr_t>(src) & 15) == 0 && row_stride % 4 == 0;
  for (int i = threadIdx.x; i < kTile * D / 4; i += kThreads) {
    const int r = i % kTile, d = (i / kTile) * 4;
    const int64_t t = r0 + r;
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (t < T) {
      const float* p = src + t * row_stride + d;
      v = vec ? *reinterpret_cast<const float4*>(p) : make_float4(p[0], p[1], p[2], p[3]);
    }
    dst[(d + 0) * kLdT + r] = __float2bfloat16_rn(v.x);
    dst[(d + 1) * kLdT + r] = __float2bfloat16_rn(v.y);
    dst[(d + 2) * kLdT + r] = __float2bfloat16_rn(v.z);
    dst[(d + 3) * kLdT + r] = __float2bfloat16_rn(v.w);
  }
}

// Rows [r0, r0 + 64) of a per-row vector (this head's part at src), times `mul`; zero past T.
__device__ void stage_vector(float* dst, const float* src, int64_t r0, int64_t T, float mul) {
  for (int i = threadIdx.x; i < kTile; i += kThreads)
    dst[i] = r0 + i < T ? src[r0 + i] * mul : 0.0f;
}

// s[j] (16 x 64 as eight 16 x 8 tiles) = a (the warp's 16 rows over D) times the 64 rows of a
// row-major tile, transposed: the B operand of column n is row n of the tile.
template <int D>
__device__ void scores(float (&s)[8][4], const uint32_t (&a)[D / 16][4], const bf16* tile) {
  const int lane = threadIdx.x % detail::kWarp, g = lane / 4, c = (lane % 4) * 2;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
    const bf16* row = tile + (j * 8 + g) * kLdRow<D>;
#pragma unroll
    for (int k = 0; k < D / 16; ++k)
      mma(s[j], a[k], ld32(row + k * 16 + c), ld32(row + k * 16 + 8 + c));
  }
}

// The A fragment of columns [16k, 16k + 16) of a 16 x 64 accumulator held as eight 16 x 8 tiles
// (the accumulator layout is the A layout, split in two column halves).
__device__ inline void as_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack(lo[0], lo[1]);
  a[1] = pack(lo[2], lo[3]);
  a[2] = pack(hi[0], hi[1]);
  a[3] = pack(hi[2], hi[3]);
}

// acc[n] (16 x D as D / 8 tiles) += p (16 x 64, in registers) times a transposed tile [D][64]:
// the B operand of output column n is row n of the transposed tile.
template <int D>
__device__ void accumulate(float (&acc)[D / 8][4], const float (&p)[8][4], const bf16* tile_t) {
  const int lane = threadIdx.x % detail::kWarp, g = lane / 4, c = (lane % 4) * 2;
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    uint32_t a[4];
    as_a(a, p[2 * k], p[2 * k + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const bf16* row = tile_t + (n * 8 + g) * kLdT + k * 16;
      mma(acc[n], a, ld32(row + c), ld32(row + 8 + c));
    }
  }
}

// Writes the warp's 16 rows of acc (16 x D), times `mul` (per row: mul0 for row g, mul1 for g+8),
// to dst + row * row_stride; rows past T left out.
template <int D>
__device__ void store_rows(float* dst, int64_t row_stride, int64_t row0, int64_t T,
                           const float (&acc)[D / 8][4], float mul0, float mul1) {
  const int lane = threadIdx.x % detail::kWarp, g = lane / 4, c = (lane % 4) * 2;
  const int64_t r0 = row0 + g, r1 = row0 + g + 8;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    if (r0 < T) {
      float* p = dst + r0 * row_stride + n * 8 + c;
      p[0] = acc[n][0] * mul0;
      p[1] = acc[n][1] * mul0;
    }
    if (r1 < T) {
      float* p = dst + r1 * row_stride + n * 8 + c;
      p[0] = acc[n][2] * mul1;
      p[1] = acc[n][3] * mul1;
    }
  }
}

template <int D>
constexpr size_t forward_smem() {
  return (kTile * kLdRow<D> + D * kLdT) * sizeof(bf16);
}

template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(float* out, float* lse, const float* qkv, Dims dm) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sVt = sK + kTile * kLdRow<D>;

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int g = lane / 4, c = (lane % 4) * 2;
  const int64_t bh = blockIdx.y, b = bh / dm.NH, h = bh % dm.NH;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;  // longest first
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * D;
  const int64_t row0 = q0 + warp * kRows;
  const int64_t t0 = row0 + g, t1 = row0 + g + 8;  // this thread's two query rows

  uint32_t qa[D / 16][4];
  load_a_rows<D>(qa, base, C3, row0, dm.T);
  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  // Running maximum (log2 domain of the scaled scores) and this thread's part of the row sums.
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;
  const float sl = dm.scale * kLog2e;

  const int64_t key_tiles = (tile_end(q0, dm.T) - 1) / kTile + 1;
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();  // the previous tile is no longer read
    stage_rows<D>(sK, base + dm.C, C3, k0, dm.T);
    stage_transposed<D>(sVt, base + 2 * dm.C, C3, k0, dm.T);
    __syncthreads();
    float s[8][4];
    scores<D>(s, qa, sK);
    // Scale into the log2 domain and mask: a key is seen by queries at or after it.
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t key = k0 + j * 8 + c + e;
        s[j][e] = key <= t0 && key < dm.T ? s[j][e] * sl : -INFINITY;
        s[j][2 + e] = key <= t1 && key < dm.T ? s[j][2 + e] * sl : -INFINITY;
        mx0 = fmaxf(mx0, s[j][e]);
        mx1 = fmaxf(mx1, s[j][2 + e]);
      }
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    // Every row sees key 0 in the first tile and at least one key in each later tile it reaches
    // (rows past T see every real key), so the new maximum is finite.
    const float n0 = fmaxf(m0, mx0), n1 = fmaxf(m1, mx1);
    const float alpha0 = exp2f(m0 - n0), alpha1 = exp2f(m1 - n1);
    m0 = n0;
    m1 = n1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      s[j][0] = exp2f(s[j][0] - n0);
      s[j][1] = exp2f(s[j][1] - n0);
      s[j][2] = exp2f(s[j][2] - n1);
      s[j][3] = exp2f(s[j][3] - n1);
      sum0 += s[j][0] + s[j][1];
      sum1 += s[j][2] + s[j][3];
    }
    l0 = l0 * alpha0 + sum0;
    l1 = l1 * alpha1 + sum1;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      o[n][0] *= alpha0;
      o[n][1] *= alpha0;
      o[n][2] *= alpha1;
      o[n][3] *= alpha1;
    }
    accumulate<D>(o, s, sVt);
  }
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  store_rows<D>(out + b * dm.T * dm.C + h * D, dm.C, row0, dm.T, o, 1.0f / l0, 1.0f / l1);
  if (c == 0) {
    constexpr float kLn2 = 0.6931471805599453f;
    if (t0 < dm.T) lse[bh * dm.T + t0] = m0 * kLn2 + logf(l0);
    if (t1 < dm.T) lse[bh * dm.T + t1] = m1 * kLn2 + logf(l1);
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
constexpr size_t backward_kv_smem() {
  return 2 * (kTile * kLdRow<D> + D * kLdT) * sizeof(bf16) + 2 * kTile * sizeof(float);
}

// Block (key tile, b * NH + h): dk and dv of 64 keys, summed over every query tile that sees
// them. The warp's 16 keys are the rows of the transposed scores S^T = K Q^T.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kv_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                             const float* dsum, Dims dm) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sQ = reinterpret_cast<bf16*>(smem);
  bf16* sQt = sQ + kTile * kLdRow<D>;
  bf16* sG = sQt + D * kLdT;  // dout
  bf16* sGt = sG + kTile * kLdRow<D>;
  float* sLse = reinterpret_cast<float*>(sGt + D * kLdT);  // log2 domain
  float* sDsum = sLse + kTile;

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int g = lane / 4, c = (lane % 4) * 2;
  const int64_t bh = blockIdx.y, b = bh / dm.NH, h = bh % dm.NH;
  const int64_t k0 = static_cast<int64_t>(blockIdx.x) * kTile;  // the most work first
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * D;
  const float* gbase = dout + b * dm.T * dm.C + h * D;
  const int64_t row0 = k0 + warp * kRows;
  const int64_t key0 = row0 + g, key1 = row0 + g + 8;

  uint32_t ka[D / 16][4], va[D / 16][4];
  load_a_rows<D>(ka, base + dm.C, C3, row0, dm.T);
  load_a_rows<D>(va, base + 2 * dm.C, C3, row0, dm.T);
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    dk[n][0] = dk[n][1] = dk[n][2] = dk[n][3] = 0.0f;
    dv[n][0] = dv[n][1] = dv[n][2] = dv[n][3] = 0.0f;
  }
  const float sl = dm.scale * kLog2e;
  const int64_t query_tiles = (dm.T - 1) / kTile + 1;
  for (int64_t qt = k0 / kTile; qt < query_tiles; ++qt) {
    const int64_t q0 = qt * kTile;
    __syncthreads();
    stage_rows<D>(sQ, base, C3, q0, dm.T);
    stage_transposed<D>(sQt, base, C3, q0, dm.T);
    stage_rows<D>(sG, gbase, dm.C, q0, dm.T);
    stage_transposed<D>(sGt, gbase, dm.C, q0, dm.T);
    stage_vector(sLse, lse + bh * dm.T, q0, dm.T, kLog2e);
    stage_vector(sDsum, dsum + bh * dm.T, q0, dm.T, 1.0f);
    __syncthreads();
    float p[8][4], ds[8][4];
    scores<D>(p, ka, sQ);   // S^T: keys by queries
    scores<D>(ds, va, sG);  // dP^T = V dO^T
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int col = j * 8 + c + e;
        const int64_t query = q0 + col;
        const bool seen = query < dm.T;
        const float lq = sLse[col], dq = sDsum[col];
        const float p0 = seen && key0 <= query ? exp2f(p[j][e] * sl - lq) : 0.0f;
        const float p1 = seen && key1 <= query ? exp2f(p[j][2 + e] * sl - lq) : 0.0f;
        ds[j][e] = p0 * (ds[j][e] - dq);
        ds[j][2 + e] = p1 * (ds[j][2 + e] - dq);
        p[j][e] = p0;
        p[j][2 + e] = p1;
      }
    }
    accumulate<D>(dv, p, sGt);   // dV += P^T dO
    accumulate<D>(dk, ds, sQt);  // dK += dS^T Q (scaled at the end)
  }
  float* dbase = dqkv + b * dm.T * C3 + h * D;
  store_rows<D>(dbase + dm.C, C3, row0, dm.T, dk, dm.scale, dm.scale);
  store_rows<D>(dbase + 2 * dm.C, C3, row0, dm.T, dv, 1.0f, 1.0f);
}

template <int D>
constexpr size_t backward_q_smem() {
  return (2 * kTile * kLdRow<D> + D * kLdT) * sizeof(bf16);
}

// Block (query tile, b * NH + h): dq of 64 queries, summed over the key tiles they see.
template <int D>
__global__ void __launch_bounds__(kThreads)
    flash_backward_q_kernel(float* dqkv, const float* dout, const float* qkv, const float* lse,
                            const float* dsum, Dims dm) {
  extern __shared__ __align__(16) unsigned char smem[];
  bf16* sK = reinterpret_cast<bf16*>(smem);
  bf16* sV = sK + kTile * kLdRow<D>;
  bf16* sKt = sV + kTile * kLdRow<D>;

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int g = lane / 4, c = (lane % 4) * 2;
  const int64_t bh = blockIdx.y, b = bh / dm.NH, h = bh % dm.NH;
  const int64_t q0 = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kTile;  // longest first
  const int64_t C3 = 3 * dm.C;
  const float* base = qkv + b * dm.T * C3 + h * D;
  const int64_t row0 = q0 + warp * kRows;
  const int64_t t0 = row0 + g, t1 = row0 + g + 8;

  uint32_t qa[D / 16][4], ga[D / 16][4];
  load_a_rows<D>(qa, base, C3, row0, dm.T);
  load_a_rows<D>(ga, dout + b * dm.T * dm.C + h * D, dm.C, row0, dm.T);
  const float* lrow = lse + bh * dm.T;
  const float* drow = dsum + bh * dm.T;
  const float l0 = t0 < dm.T ? lrow[t0] * kLog2e : 0.0f, l1 = t1 < dm.T ? lrow[t1] * kLog2e : 0.0f;
  const float d0 = t0 < dm.T ? drow[t0] : 0.0f, d1 = t1 < dm.T ? drow[t1] : 0.0f;
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;
  const float sl = dm.scale * kLog2e;
  const int64_t key_tiles = (tile_end(q0, dm.T) - 1) / kTile + 1;
  for (int64_t kt = 0; kt < key_tiles; ++kt) {
    const int64_t k0 = kt * kTile;
    __syncthreads();
    stage_rows<D>(sK, base + dm.C, C3, k0, dm.T);
    stage_rows<D>(sV, base + 2 * dm.C, C3, k0, dm.T);
    stage_transposed<D>(sKt, base + dm.C, C3, k0, dm.T);
    __syncthreads();
    float s[8][4], ds[8][4];
    scores<D>(s, qa, sK);   // S = Q K^T
    scores<D>(ds, ga, sV);  // dP = dO V^T
#pragma unroll
    for (int j = 0; j < 8; ++j) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int64_t key = k0 + j * 8 + c + e;
        const float p0 = t0 < dm.T && key <= t0 ? exp2f(s[j][e] * sl - l0) : 0.0f;
        const float p1 = t1 < dm.T && key <= t1 ? exp2f(s[j][2 + e] * sl - l1) : 0.0f;
        ds[j][e] = p0 * (ds[j][e] - d0);
        ds[j][2 + e] = p1 * (ds[j][2 + e] - d1);
      }
    }
    accumulate<D>(dq, ds, sKt);  // dQ += dS K (scaled at the end)
  }
  store_rows<D>(dqkv + b * dm.T * C3 + h * D, C3, row0, dm.T, dq, dm.scale, dm.scale);
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

dim3 grid_for_tiles(int64_t B, const Dims& dm) {
  return dim3(static_cast<unsigned>((dm.T + kTile - 1) / kTile), static_cast<unsigned>(B * dm.NH));
}

template <int D>
void forward_for(float* out, float* lse, const float* qkv, int64_t B, Dims dm,
                 cudaStream_t stream) {
  constexpr size_t bytes = forward_smem<D>();
  allow_smem(flash_forward_kernel<D>, bytes);
  flash_forward_kernel<D><<<grid_for_tiles(B, dm), kThreads, bytes, stream>>>(out, lse, qkv, dm);
  MT_CUDA_CHECK_LAUNCH();
}

template <int D>
void backward_for(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                  const float* lse, int64_t B, Dims dm, cudaStream_t stream) {
  constexpr size_t kv_bytes = backward_kv_smem<D>(), q_bytes = backward_q_smem<D>();
  allow_smem(flash_backward_kv_kernel<D>, kv_bytes);
  allow_smem(flash_backward_q_kernel<D>, q_bytes);
  flash_backward_kv_kernel<D>
      <<<grid_for_tiles(B, dm), kThreads, kv_bytes, stream>>>(dqkv, dout, qkv, lse, dsum, dm);
  MT_CUDA_CHECK_LAUNCH();
  flash_backward_q_kernel<D>
      <<<grid_for_tiles(B, dm), kThreads, q_bytes, stream>>>(dqkv, dout, qkv, lse, dsum, dm);
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
