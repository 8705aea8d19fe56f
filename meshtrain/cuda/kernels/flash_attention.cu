// Tiles of 64 queries by 64 keys; a block of four warps, each owning 16 rows of its block's tile
// (queries in the forward and the dq kernel, keys in the dk/dv kernel). Products are PTX
// mma.sync m16n8k16 bf16 or f16 instructions whose fragment layouts are fixed by the ISA, so the
// scores stay in registers: the softmax, the masks and the conversion of probabilities into the
// next product's operand happen where the accumulators are (FlashAttention-2's structure). Each
// thread holds, of a 16 x 8 accumulator tile, rows g = lane / 4 and g + 8 at columns
// 2 * (lane % 4) and the next one; a row's four threads are lanes 4g .. 4g + 3.
//
// q, k, v arrive in bf16 or f16 (autocast's half activations, kept from the forward for the
// backward) and so does dout under autocast (an f32 dout is cast to the half type once per call),
// so that tiles move to shared memory as raw 16-byte copies (cp.async, the next tile's copies in
// flight while the current one is multiplied). Shared tiles are row-major only: an operand that
// runs over the tile's rows (v in P V, q and dout in the key-side products, k in dS K) is read
// transposed by ldmatrix.trans.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernels/cast.h"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/flash_attention.h"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/cuda/stream.h"
#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

// The kernels' 16-bit elements, bf16 or f16 (their template parameter E): tiles move as raw bits
// (cp.async, ldmatrix), and only the products (mma) and the packing of f32 values into their
// operands (pack) read them as numbers.
using h16 = uint16_t;
using bf16 = __nv_bfloat16;
using f16 = __half;

std::atomic<bool> g_atomic_dq{false};

constexpr int kTile = 64;
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * detail::kWarp;
constexpr int kRows = kTile / kWarps;  // rows of a tile per warp: one m16 fragment
constexpr float kLog2e = 1.4426950408889634f;

// Leading dimension (bf16 elements) of the [64][D] shared tiles, padded by 8 against bank
// conflicts (and keeping rows 16-byte aligned for cp.async and ldmatrix).
template <int D>
constexpr int kLdRow = D + 8;  // [64][D] tiles

struct Dims {
  int64_t T, C, NH;
  float scale;  // 1 / sqrt(head size)
};

template <typename E>
__device__ inline uint32_t pack(float lo, float hi) {
  if constexpr (std::is_same_v<E, f16>) {
    const __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  } else {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<const uint32_t*>(&v);
  }
}

__device__ inline uint32_t ld32(const h16* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// c += a (16 x 16, row-major fragment) * b (16 x 8, column fragment) in E, f32 accumulation.
template <typename E>
__device__ inline void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<E, f16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// One past the last row of the tile that starts at r0.
__device__ inline int64_t tile_end(int64_t r0, int64_t T) {
  return r0 + kTile < T ? r0 + kTile : T;
}

// The A fragments of rows [row0, row0 + 16) of a head's bf16 slice (rows row_stride elements
// apart, rows past T zero): D / 16 fragments over the head dimension, held for a whole kernel.
template <int D>
__device__ void load_a_rows(uint32_t (&a)[D / 16][4], const h16* src, int64_t row_stride,
                            int64_t row0, int64_t T) {
  const int lane = threadIdx.x % detail::kWarp, g = lane / 4, c = (lane % 4) * 2;
  auto pair = [&](int64_t r, int col) { return r < T ? ld32(src + r * row_stride + col) : 0u; };
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    a[k][0] = pair(row0 + g, k * 16 + c);
    a[k][1] = pair(row0 + g + 8, k * 16 + c);
    a[k][2] = pair(row0 + g, k * 16 + 8 + c);
    a[k][3] = pair(row0 + g + 8, k * 16 + 8 + c);
  }
}

// 16 bytes from global to shared memory without passing through registers; zeros when !valid.
__device__ inline void cp_async16(h16* dst, const h16* src, bool valid) {
  const auto s = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ inline void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Starts copying rows [r0, r0 + 64) of a head's bf16 slice into a row-major tile [64][D] (rows
// past T zero), with the block's `Threads` threads.
template <int D, int Threads = kThreads>
__device__ void stage_rows(h16* dst, const h16* src, int64_t row_stride, int64_t r0, int64_t T) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kTile * kChunks; i += Threads) {
    const int r = i / kChunks, ch = (i % kChunks) * 8;
    const bool valid = r0 + r < T;
    cp_async16(dst + r * kLdRow<D> + ch, valid ? src + (r0 + r) * row_stride + ch : src, valid);
  }
}

// Rows [r0, r0 + 64) of a per-row vector (this head's part at src), times `mul`; zero past T.
__device__ void stage_vector(float* dst, const float* src, int64_t r0, int64_t T, float mul) {
  for (int i = threadIdx.x; i < kTile; i += kThreads)
    dst[i] = r0 + i < T ? src[r0 + i] * mul : 0.0f;
}

// Four 8 x 8 bf16 matrices from shared memory: lane l gives the address of row l % 8 of matrix
// l / 8 and receives, of each matrix, row l / 4 at columns 2 (l % 4) and the next: the B operand
// of an mma whose n runs over the matrix's rows.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const h16* p) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// s (16 x 8) = a (the warp's 16 rows over D) times rows [8j, 8j + 8) of a row-major tile,
// transposed: the B operand of column n is row 8j + n of the tile. One ldmatrix gives the B
// operands of two k steps (matrix m holds columns 16 k + 8 m ..: b0 and b1 of step k, then of step
// k + 1), in place of four 32-bit loads.
template <int D, typename E>
__device__ void score_tile(float (&s)[4], const uint32_t (&a)[D / 16][4], const h16* tile, int j) {
  static_assert(D % 32 == 0, "k steps go in pairs");
  const int lane = threadIdx.x % detail::kWarp;
  s[0] = s[1] = s[2] = s[3] = 0.0f;
  const h16* row = tile + (j * 8 + lane % 8) * kLdRow<D> + (lane / 8) * 8;
#pragma unroll
  for (int k = 0; k < D / 16; k += 2) {
    uint32_t b[4];
    ldmatrix_x4(b, row + k * 16);
    mma<E>(s, a[k], b[0], b[1]);
    mma<E>(s, a[k + 1], b[2], b[3]);
  }
}

// 2^x on the special function unit, a subnormal result flushed to zero: every probability here
// is relative to a row's maximum or its sum (at least 1), so one below 2^-126 adds nothing that f32
// or bf16 can hold (exp2f spends extra instructions on keeping subnormals).
__device__ inline float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// The causal mask of a tile on the diagonal, on scores not yet exponentiated (-inf: the
// probability is 0). Element e of column tile j is column 8j + e past the thread's first column.
// Query-side (rows are queries): a column past `last` (row g; row g + 8 sees 8 more) is a later
// key.
__device__ inline void mask_after(float (&s)[8][4], int last) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (j * 8 + e > last) s[j][e] = -INFINITY;
      if (j * 8 + e > last + 8) s[j][2 + e] = -INFINITY;
    }
  }
}
// Key-side (rows are keys, columns queries): a column before `first` (row g; row g + 8 starts 8
// later) is an earlier query.
__device__ inline void mask_before(float (&s)[8][4], int first) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (j * 8 + e < first) s[j][e] = -INFINITY;
      if (j * 8 + e < first + 8) s[j][2 + e] = -INFINITY;
    }
  }
}

// The A fragment of columns [16k, 16k + 16) of a 16 x 64 accumulator held as eight 16 x 8 tiles
// (the accumulator layout is the A layout, split in two column halves).
template <typename E>
__device__ inline void as_a(uint32_t (&a)[4], const float (&lo)[4], const float (&hi)[4]) {
  a[0] = pack<E>(lo[0], lo[1]);
  a[1] = pack<E>(lo[2], lo[3]);
  a[2] = pack<E>(hi[0], hi[1]);
  a[3] = pack<E>(hi[2], hi[3]);
}

// Four 8 x 8 bf16 matrices from shared memory, transposed: lane l gives the address of row l % 8
// of matrix l / 8 and receives, of each matrix, the pair of rows 2 (l % 4) and 2 (l % 4) + 1 at
// column l / 4: the B operand of an mma whose k runs over the matrix's rows.
__device__ inline void ldmatrix_x4_trans(uint32_t (&r)[4], const h16* p) {
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Writes the warp's 16 rows of acc (16 x D), times `mul` (per row: mul0 for row g, mul1 for g+8),
// to dst + row * row_stride; rows past T left out.
template <int D, typename O>
__device__ void store_rows(O* dst, int64_t row_stride, int64_t row0, int64_t T,
                           const float (&acc)[D / 8][4], float mul0, float mul1) {
  const int lane = threadIdx.x % detail::kWarp, g = lane / 4, c = (lane % 4) * 2;
  const int64_t r0 = row0 + g, r1 = row0 + g + 8;
  // A thread's two columns are adjacent and start at an even element (row strides, head offsets
  // and c are even): one paired store each.
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    if (r0 < T)
      detail::store2_f32(dst + r0 * row_stride + n * 8 + c, 0, acc[n][0] * mul0, acc[n][1] * mul0);
    if (r1 < T)
      detail::store2_f32(dst + r1 * row_stride + n * 8 + c, 0, acc[n][2] * mul1, acc[n][3] * mul1);
  }
}

constexpr size_t tile_bytes(int D) {
  return static_cast<size_t>(kTile) * (D + 8) * sizeof(h16);
}

// k and v tiles, two of each: the next key tile's copies fly while the current one is used.
// The k and v tiles of a kernel that walks the key tiles of one query tile (the forward and
// the dq kernel), double-buffered in shared memory: tile kt sits in buffer kt % 2.
template <int D, int Threads = kThreads>
struct KeyValueTiles {
  static constexpr int64_t kElems = int64_t{kTile} * kLdRow<D>;
  h16* k;
  h16* v;
  const h16* base;  // this head's q at row 0 of the batch element; k and v follow at C, 2C
  int64_t C, T;

  __device__ KeyValueTiles(unsigned char* smem, const h16* head, int64_t C_, int64_t T_)
      : k(reinterpret_cast<h16*>(smem)), v(k + 2 * kElems), base(head), C(C_), T(T_) {}

  // Starts copying key tile kt into buffer `buf`.
  __device__ void start(int64_t kt, int buf) {
    stage_rows<D, Threads>(k + buf * kElems, base + C, 3 * C, kt * kTile, T);
    stage_rows<D, Threads>(v + buf * kElems, base + 2 * C, 3 * C, kt * kTile, T);
    cp_async_commit();
  }
  // Waits for tile kt, with tile kt + 1 (if any) in flight behind it; returns kt's buffer.
  __device__ int ready(int64_t kt, int64_t tiles) {
    const int buf = static_cast<int>(kt & 1);
    // The other buffer was last read in iteration kt - 1, before its closing barrier.
    if (kt + 1 < tiles) {
      start(kt + 1, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    return buf;
  }
  __device__ const h16* key(int buf) const { return k + buf * kElems; }
  __device__ const h16* value(int buf) const { return v + buf * kElems; }
};

// A query-side block's place: block (b * NH + h, query tile), the longest rows first; this
// warp's `warp_rows` rows from row0, this thread's two rows t0 and t1 (of the warp's first 16) and
// its column pair offset c.
struct QueryBlock {
  int warp, lane, g, c;
  int64_t bh, b, h, q0, row0, t0, t1;
  __device__ explicit QueryBlock(const Dims& dm, int warp_rows = kRows)
      : warp(threadIdx.x / detail::kWarp),
        lane(threadIdx.x % detail::kWarp),
        g(lane / 4),
        c((lane % 4) * 2),
        bh(blockIdx.x),
        b(bh / dm.NH),
        h(bh % dm.NH),
        q0(static_cast<int64_t>(gridDim.y - 1 - blockIdx.y) * kTile),
        row0(q0 + warp * warp_rows),
        t0(row0 + g),
        t1(row0 + g + 8) {}
};

// k and v tiles, two of each, then the block's q tile.
template <int D>
constexpr size_t forward_smem() {
  return 5 * tile_bytes(D);
}

// Warps and threads of a forward block whose warps own kM m16 fragments (16 kM query rows) each:
// the block's 64 rows either way.
template <int kM>
constexpr int kForwardWarps = kWarps / kM;
template <int kM>
constexpr int kForwardThreads = kForwardWarps<kM>* detail::kWarp;

// s[m] (16 x 64 each) = the A operands of fragment m times the 64 rows of a row-major tile,
// transposed (scores<D> for kM fragments), the A operands read from shared memory (q_rows: the
// warp's first row of a row-major [64][D] tile) two k steps at a time instead of held in registers
// through the kernel, and each B operand loaded once for all fragments: the same products in the
// same order as scores<D>.
template <int D, int kM, typename E>
__device__ void scores_from_shared(float (&s)[kM][8][4], const h16* q_rows, const h16* tile) {
  const int lane = threadIdx.x % detail::kWarp;
#pragma unroll
  for (int m = 0; m < kM; ++m)
#pragma unroll
    for (int j = 0; j < 8; ++j) s[m][j][0] = s[m][j][1] = s[m][j][2] = s[m][j][3] = 0.0f;
  // ldmatrix matrix i (addresses from lanes 8i .. 8i + 7) is rows 8 (i % 2) .. + 7 at columns
  // 8 (i / 2) ..: the a[0..3] of load_a_rows.
  const h16* qp = q_rows + (lane % 16) * kLdRow<D> + (lane / 16) * 8;
#pragma unroll
  for (int k = 0; k < D / 16; k += 2) {
    uint32_t a[kM][2][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      ldmatrix_x4(a[m][0], qp + m * kRows * kLdRow<D> + k * 16);
      ldmatrix_x4(a[m][1], qp + m * kRows * kLdRow<D> + (k + 1) * 16);
    }
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      uint32_t b[4];
      ldmatrix_x4(b, tile + (j * 8 + lane % 8) * kLdRow<D> + (lane / 8) * 8 + k * 16);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma<E>(s[m][j], a[m][0], b[0], b[1]);
        mma<E>(s[m][j], a[m][1], b[2], b[3]);
      }
    }
  }
}

// acc[m] += p[m] times a row-major tile [64][D]: accumulate<D> for kM fragments, each B operand
// loaded once for all of them. With kKeep (one fragment) the bf16 A operands formed from p are
// also stored, as they are formed, at `keep`: this thread's row g, column c of a
// [..][kLdRow<kTile>] tile (the operands the product takes, for another product to read).
template <int D, int kM, typename E, bool kKeep = false>
__device__ void accumulate_of(float (&acc)[kM][D / 8][4], const float (&p)[kM][8][4],
                              const h16* tile, h16* keep = nullptr) {
  static_assert(!kKeep || kM == 1, "one fragment is kept");
  const int lane = threadIdx.x % detail::kWarp, mi = lane / 8, ri = lane % 8;
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    uint32_t a[kM][4];
#pragma unroll
    for (int m = 0; m < kM; ++m) as_a<E>(a[m], p[m][2 * k], p[m][2 * k + 1]);
    if constexpr (kKeep) {
      *reinterpret_cast<uint32_t*>(keep + k * 16) = a[0][0];
      *reinterpret_cast<uint32_t*>(keep + 8 * kLdRow<kTile> + k * 16) = a[0][1];
      *reinterpret_cast<uint32_t*>(keep + k * 16 + 8) = a[0][2];
      *reinterpret_cast<uint32_t*>(keep + 8 * kLdRow<kTile> + k * 16 + 8) = a[0][3];
    }
#pragma unroll
    for (int q = 0; q < D / 16; ++q) {
      uint32_t b[4];
      ldmatrix_x4_trans(b,
                        tile + (k * 16 + (mi & 1) * 8 + ri) * kLdRow<D> + q * 16 + (mi >> 1) * 8);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        mma<E>(acc[m][2 * q], a[m], b[0], b[1]);
        mma<E>(acc[m][2 * q + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// The one-fragment products of the dq and dk/dv kernels (a warp's 16 rows): S (or S^T) = a times
// a tile transposed, and acc += p times a tile (k over the tile's rows, read transposed).
template <int D, typename E>
__device__ void scores(float (&s)[8][4], const uint32_t (&a)[D / 16][4], const h16* tile) {
#pragma unroll
  for (int j = 0; j < 8; ++j) score_tile<D, E>(s[j], a, tile, j);
}
template <int D, typename E, bool kKeep = false>
__device__ void accumulate(float (&acc)[D / 8][4], const float (&p)[8][4], const h16* tile,
                           h16* keep = nullptr) {
  accumulate_of<D, 1, E, kKeep>(reinterpret_cast<float(&)[1][D / 8][4]>(acc),
                                reinterpret_cast<const float(&)[1][8][4]>(p), tile, keep);
}

// One key tile's step of the online softmax for a fragment's 16 rows: s (raw scores, masked to
// -inf) becomes the probabilities relative to the new running maxima mx[0..1] (log2 domain of the
// scaled scores); the row sums l[0..1] (this thread's part) and the output o are rescaled to them.
// The maximum of the raw scores is the maximum of the scaled ones (the scale is positive and
// rounding is monotonic); the scaling goes into the exponent's fused multiply-add. Every row sees
// at least one key in each tile it reaches (key 0 in the first, row g + 8 of the diagonal tile
// sees the keys row g does), so the new maximum is finite.
template <int D>
__device__ void online_softmax(float (&s)[8][4], float (&o)[D / 8][4], float (&mx)[2],
                               float (&l)[2], float sl) {
  float t0 = -INFINITY, t1 = -INFINITY;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    t0 = fmaxf(t0, fmaxf(s[j][0], s[j][1]));
    t1 = fmaxf(t1, fmaxf(s[j][2], s[j][3]));
  }
  t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 1));
  t0 = fmaxf(t0, __shfl_xor_sync(0xffffffffu, t0, 2));
  t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 1));
  t1 = fmaxf(t1, __shfl_xor_sync(0xffffffffu, t1, 2));
  const float n0 = fmaxf(mx[0], t0 * sl), n1 = fmaxf(mx[1], t1 * sl);
  const float alpha0 = exp2_ftz(mx[0] - n0), alpha1 = exp2_ftz(mx[1] - n1);
  mx[0] = n0;
  mx[1] = n1;
  float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    s[j][0] = exp2_ftz(fmaf(s[j][0], sl, -n0));
    s[j][1] = exp2_ftz(fmaf(s[j][1], sl, -n0));
    s[j][2] = exp2_ftz(fmaf(s[j][2], sl, -n1));
    s[j][3] = exp2_ftz(fmaf(s[j][3], sl, -n1));
    sum0 += s[j][0] + s[j][1];
    sum1 += s[j][2] + s[j][3];
  }
  l[0] = l[0] * alpha0 + sum0;
  l[1] = l[1] * alpha1 + sum1;
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= alpha0;
    o[n][1] *= alpha0;
    o[n][2] *= alpha1;
    o[n][3] *= alpha1;
  }
}

// O: the output's type, f32 or the half type E (rounded once, for a half product and the
// backward). A warp owns kM fragments of 16 query rows (kForwardWarps<kM> warps a block): with
// two, each key and value operand loaded from shared memory serves twice the products.
template <int D, int kM, typename E, typename O>
__global__ void __launch_bounds__(kForwardThreads<kM>)
    flash_forward_kernel(O* out, float* lse, const h16* qkv, Dims dm) {
  extern __shared__ __align__(16) unsigned char smem[];
  const QueryBlock qb(dm, kRows * kM);
  const int c = qb.c, g = qb.g;
  const int64_t row0 = qb.row0, bh = qb.bh;
  const int64_t C3 = 3 * dm.C;
  const h16* base = qkv + qb.b * dm.T * C3 + qb.h * D;
  KeyValueTiles<D, kForwardThreads<kM>> tiles(smem, base, dm.C, dm.T);
  const int64_t key_tiles = (tile_end(qb.q0, dm.T) - 1) / kTile + 1;
  // The queries stay in shared memory, read for each key tile's scores: held in registers through
  // the kernel, they cost a block an SM (one fragment a warp) or spills (two).
  h16* sQ = reinterpret_cast<h16*>(smem + 4 * tile_bytes(D));
  stage_rows<D, kForwardThreads<kM>>(sQ, base, C3, qb.q0, dm.T);  // with key tile 0's copies
  tiles.start(0, 0);
  const h16* warp_q = sQ + (row0 - qb.q0) * kLdRow<D>;

  float o[kM][D / 8][4];
  // Running maxima (log2 domain of the scaled scores) and this thread's part of the row sums, of
  // its rows g and g + 8 of each fragment.
  float mx[kM][2], l[kM][2];
  // The last key tile is the diagonal one (k0 = q0), the only one with keys after a query (and
  // with keys past T: they come after every query before T, and the rows past T, zeros never
  // stored, see zeros). The tiles before it go through a copy of the step without the mask.
  int last[kM];
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.0f;
    mx[m][0] = mx[m][1] = -INFINITY;
    l[m][0] = l[m][1] = 0.0f;
    last[m] = static_cast<int>(row0 + m * kRows + g - qb.q0) - c;
  }
  const float sl = dm.scale * kLog2e;

  auto step = [&](int64_t kt, auto diagonal) {
    const int buf = tiles.ready(kt, key_tiles);
    float s[kM][8][4];
    scores_from_shared<D, kM, E>(s, warp_q, tiles.key(buf));
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if constexpr (decltype(diagonal)::value) mask_after(s[m], last[m]);
      online_softmax<D>(s[m], o[m], mx[m], l[m], sl);
    }
    accumulate_of<D, kM, E>(o, s, tiles.value(buf));
    __syncthreads();  // this buffer is refilled two iterations on
  };
  for (int64_t kt = 0; kt + 1 < key_tiles; ++kt) step(kt, std::false_type{});
  step(key_tiles - 1, std::true_type{});
  constexpr float kLn2 = 0.6931471805599453f;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[m][r] += __shfl_xor_sync(0xffffffffu, l[m][r], 1);
      l[m][r] += __shfl_xor_sync(0xffffffffu, l[m][r], 2);
    }
    const int64_t rows = row0 + m * kRows;
    store_rows<D>(out + qb.b * dm.T * dm.C + qb.h * D, dm.C, rows, dm.T, o[m], 1.0f / l[m][0],
                  1.0f / l[m][1]);
    if (c == 0) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int64_t t = rows + g + 8 * r;
        if (t < dm.T) lse[bh * dm.T + t] = mx[m][r] * kLn2 + logf(l[m][r]);
      }
    }
  }
}

// dsum[b, h, t] = dout[b, t, h, :] . out[b, t, h, :]: one warp per row of one head; out in the
// forward's output type (a bf16 output, as FlashAttention-2 under autocast keeps it), and so dout
// (the gradient of a bf16 output is bf16).
template <typename O>
__global__ void flash_backward_dot_kernel(float* dsum, const O* dout, const O* out, Dims dm, int D,
                                          int64_t rows) {
  const int64_t row =
      static_cast<int64_t>(blockIdx.x) * (blockDim.x / detail::kWarp) + threadIdx.x / detail::kWarp;
  if (row >= rows) return;
  const int lane = threadIdx.x % detail::kWarp;
  const int64_t h = row % dm.NH, bt = row / dm.NH, b = bt / dm.T, t = bt % dm.T;
  const O* g = dout + bt * dm.C + h * D;
  const O* o = out + bt * dm.C + h * D;
  float s = 0.0f;
  for (int d = lane; d < D; d += detail::kWarp)
    s += detail::load_f32(g, d) * detail::load_f32(o, d);
  s = detail::warp_sum(s);
  if (lane == 0) dsum[(b * dm.NH + h) * dm.T + t] = s;
}

// q and dout tiles, two of each, then the logsumexp and dsum of both query tiles; with
// kAtomicDq also the block's k tile and a dS^T tile [64 keys][64 queries].
template <int D, bool kAtomicDq>
constexpr size_t backward_kv_smem() {
  return 4 * tile_bytes(D) + 4 * kTile * sizeof(float) +
         (kAtomicDq ? tile_bytes(D) + tile_bytes(kTile) : 0);
}

// Adds the pair (x, y) to p[0], p[1] (8-byte aligned) with atomics: one vector atomic on sm_90.
__device__ inline void atomic_add2(float* p, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  atomicAdd(reinterpret_cast<float2*>(p), make_float2(x, y));
#else
  atomicAdd(p, x);
  atomicAdd(p + 1, y);
#endif
}

// dq_acc rows [q0 + 16 warp, + 16) (this warp's 16 queries of the tile; D floats a row) += dS K
// over the block's 64 keys: dS read from the dS^T tile (stored [key][query], so its A operands
// come transposed by ldmatrix.trans), K from the block's key tile (its B operands likewise, as in
// accumulate). A pair of 8-column tiles at a time, added with atomics: every key tile's block adds
// to the same rows. Rows past T left out.
template <int D, typename E>
__device__ void add_dq(float* dq_acc, int64_t q0, int64_t T, const h16* ds_t, const h16* k_tile) {
  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int mi = lane / 8, ri = lane % 8, g = lane / 4, c = (lane % 4) * 2;
  const int64_t r0 = q0 + warp * kRows + g, r1 = r0 + 8;
#pragma unroll
  for (int q = 0; q < D / 16; ++q) {
    float acc[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < kTile / 16; ++kk) {
      uint32_t a[4], b[4];
      ldmatrix_x4_trans(
          a, ds_t + (kk * 16 + (mi >> 1) * 8 + ri) * kLdRow<kTile> + warp * kRows + (mi & 1) * 8);
      ldmatrix_x4_trans(
          b, k_tile + (kk * 16 + (mi & 1) * 8 + ri) * kLdRow<D> + q * 16 + (mi >> 1) * 8);
      mma<E>(acc[0], a, b[0], b[1]);
      mma<E>(acc[1], a, b[2], b[3]);
    }
#pragma unroll
    for (int n = 0; n < 2; ++n) {
      const int col = q * 16 + n * 8 + c;
      if (r0 < T) atomic_add2(dq_acc + r0 * D + col, acc[n][0], acc[n][1]);
      if (r1 < T) atomic_add2(dq_acc + r1 * D + col, acc[n][2], acc[n][3]);
    }
  }
}

// Block (b * NH + h, key tile): dk and dv of 64 keys, summed over every query tile that sees
// them. The warp's 16 keys are the rows of the transposed scores S^T = K Q^T. dqkv is f32 or
// bf16 (DQ: the gradient of bf16 q, k, v is bf16). With kAtomicDq the block also adds its keys'
// part of dq (dS K, unscaled) to dq_acc [B * NH][T][D] with atomics, FlashAttention-2's single
// pass: five products a tile pair instead of the seven of this kernel and the dq kernel, and the
// sums in an order that varies from run to run.
template <int D, typename E, typename DQ, bool kAtomicDq>
__global__ void __launch_bounds__(kThreads)
    flash_backward_kv_kernel(DQ* dqkv, const h16* dout, const h16* qkv, const float* lse,
                             const float* dsum, Dims dm, float* dq_acc) {
  extern __shared__ __align__(16) unsigned char smem[];
  // Buffer i of q at sQ + i * kTileElems, of dout at sG + i * kTileElems; of the logsumexp (log2
  // domain) at sLse + i * kTile, of dsum at sDsum + i * kTile.
  constexpr int64_t kTileElems = int64_t{kTile} * kLdRow<D>;
  h16* sQ = reinterpret_cast<h16*>(smem);
  h16* sG = sQ + 2 * kTileElems;
  float* sLse = reinterpret_cast<float*>(sG + 2 * kTileElems);
  float* sDsum = sLse + 2 * kTile;
  h16* sK = reinterpret_cast<h16*>(sDsum + 2 * kTile);  // kAtomicDq only, as sDS
  h16* sDS = sK + kTileElems;

  const int warp = threadIdx.x / detail::kWarp, lane = threadIdx.x % detail::kWarp;
  const int g = lane / 4, c = (lane % 4) * 2;
  const int64_t bh = blockIdx.x, b = bh / dm.NH, h = bh % dm.NH;
  const int64_t k0 = static_cast<int64_t>(blockIdx.y) * kTile;  // the most work first
  const int64_t C3 = 3 * dm.C;
  const h16* base = qkv + b * dm.T * C3 + h * D;
  const h16* gbase = dout + b * dm.T * dm.C + h * D;
  const int64_t row0 = k0 + warp * kRows;
  // On the diagonal query tile (q0 = k0), row g's key is query warp * 16 + g of the tile.
  const int diagonal_first = warp * kRows + g - c;

  const int64_t first = k0 / kTile, query_tiles = (dm.T - 1) / kTile + 1;
  stage_rows<D>(sQ, base, C3, first * kTile, dm.T);
  stage_rows<D>(sG, gbase, dm.C, first * kTile, dm.T);
  if constexpr (kAtomicDq) stage_rows<D>(sK, base + dm.C, C3, k0, dm.T);
  cp_async_commit();
  stage_vector(sLse, lse + bh * dm.T, first * kTile, dm.T, kLog2e);
  stage_vector(sDsum, dsum + bh * dm.T, first * kTile, dm.T, 1.0f);

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
  auto step = [&](int64_t qt, auto diagonal) {
    const int64_t q0 = qt * kTile;
    const int buf = static_cast<int>((qt - first) & 1);
    if (qt + 1 < query_tiles) {
      stage_rows<D>(sQ + (buf ^ 1) * kTileElems, base, C3, q0 + kTile, dm.T);
      stage_rows<D>(sG + (buf ^ 1) * kTileElems, gbase, dm.C, q0 + kTile, dm.T);
      cp_async_commit();
      stage_vector(sLse + (buf ^ 1) * kTile, lse + bh * dm.T, q0 + kTile, dm.T, kLog2e);
      stage_vector(sDsum + (buf ^ 1) * kTile, dsum + bh * dm.T, q0 + kTile, dm.T, 1.0f);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const h16* q_tile = sQ + buf * kTileElems;
    const h16* g_tile = sG + buf * kTileElems;
    const float* lse_tile = sLse + buf * kTile;
    const float* dsum_tile = sDsum + buf * kTile;
    float p[8][4];
    scores<D, E>(p, ka, q_tile);  // S^T: keys by queries
    if constexpr (decltype(diagonal)::value) mask_before(p, diagonal_first);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      // The two columns of a thread are adjacent: one 8-byte load.
      const float2 lq = *reinterpret_cast<const float2*>(lse_tile + j * 8 + c);
      p[j][0] = exp2_ftz(fmaf(p[j][0], sl, -lq.x));
      p[j][1] = exp2_ftz(fmaf(p[j][1], sl, -lq.y));
      p[j][2] = exp2_ftz(fmaf(p[j][2], sl, -lq.x));
      p[j][3] = exp2_ftz(fmaf(p[j][3], sl, -lq.y));
    }
    accumulate<D, E>(dv, p, g_tile);  // dV += P^T dO
    // dS^T = P^T * (dP^T - dsum) in place of P, dP^T = V dO^T one column tile at a time: P and
    // dP^T are never both held whole.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float dp[4];
      score_tile<D, E>(dp, va, g_tile, j);
      const float2 dq = *reinterpret_cast<const float2*>(dsum_tile + j * 8 + c);
      p[j][0] *= dp[0] - dq.x;
      p[j][1] *= dp[1] - dq.y;
      p[j][2] *= dp[2] - dq.x;
      p[j][3] *= dp[3] - dq.y;
    }
    if constexpr (kAtomicDq) {
      // dK += dS^T Q, and dS^T (its bf16 operands) to shared memory for dq.
      accumulate<D, E, true>(dk, p, q_tile, sDS + (warp * kRows + g) * kLdRow<kTile> + c);
      __syncthreads();
      add_dq<D, E>(dq_acc + bh * dm.T * D, q0, dm.T, sDS, sK);  // dQ += dS K (scaled at the end)
    } else {
      accumulate<D, E>(dk, p, q_tile);  // dK += dS^T Q (scaled at the end)
    }
    __syncthreads();
  };
  // Only the first query tile (the diagonal) has queries before a key; the tiles after it go
  // through a copy of the step without the mask. Queries past T see zero rows of q and dout and
  // a zero logsumexp and dsum: a probability of 1 that multiplies zeros only, as the 0 it
  // replaces did.
  step(first, std::true_type{});
  for (int64_t qt = first + 1; qt < query_tiles; ++qt) step(qt, std::false_type{});
  DQ* dbase = dqkv + b * dm.T * C3 + h * D;
  store_rows<D>(dbase + dm.C, C3, row0, dm.T, dk, dm.scale, dm.scale);
  store_rows<D>(dbase + 2 * dm.C, C3, row0, dm.T, dv, 1.0f, 1.0f);
}

// dqkv's q part (rows of 3C, head h at h * D) = dq_acc [B * NH][T][D] times the scale, in DQ.
template <typename DQ>
__global__ void dq_from_accumulator_kernel(DQ* dqkv, const float* dq_acc, Dims dm, int D,
                                           int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t d = i % D, t = (i / D) % dm.T, bh = i / (D * dm.T);
    const int64_t b = bh / dm.NH, h = bh % dm.NH;
    detail::store_f32(dqkv, (b * dm.T + t) * 3 * dm.C + h * D + d, dq_acc[i] * dm.scale);
  }
}

// k and v tiles, two of each.
template <int D>
constexpr size_t backward_q_smem() {
  return 4 * tile_bytes(D);
}

// Block (b * NH + h, query tile): dq of 64 queries, summed over the key tiles they see.
template <int D, typename E, typename DQ>
__global__ void __launch_bounds__(kThreads)
    flash_backward_q_kernel(DQ* dqkv, const h16* dout, const h16* qkv, const float* lse,
                            const float* dsum, Dims dm) {
  extern __shared__ __align__(16) unsigned char smem[];
  const QueryBlock qb(dm);
  const int c = qb.c;
  const int64_t t0 = qb.t0, t1 = qb.t1, row0 = qb.row0, bh = qb.bh, b = qb.b, h = qb.h;
  const int64_t C3 = 3 * dm.C;
  const h16* base = qkv + b * dm.T * C3 + h * D;
  KeyValueTiles<D> tiles(smem, base, dm.C, dm.T);
  const int64_t key_tiles = (tile_end(qb.q0, dm.T) - 1) / kTile + 1;
  tiles.start(0, 0);

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
  // As in the forward, only the last key tile (the diagonal) has keys after a query. Rows past T
  // (zero q and dout, a zero logsumexp and dsum) get probabilities that multiply zeros only and
  // are never stored.
  const int last = static_cast<int>(t0 - qb.q0) - c;
  auto step = [&](int64_t kt, auto diagonal) {
    const int buf = tiles.ready(kt, key_tiles);
    float s[8][4];
    scores<D, E>(s, qa, tiles.key(buf));  // S = Q K^T
    if constexpr (decltype(diagonal)::value) mask_after(s, last);
      // dS = P * (dP - dsum) in place of S, dP = dO V^T one column tile at a time (as in the dk/dv
      // kernel: S and dP are never both held whole).
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      float dp[4];
      score_tile<D, E>(dp, ga, tiles.value(buf), j);
      s[j][0] = exp2_ftz(fmaf(s[j][0], sl, -l0)) * (dp[0] - d0);
      s[j][1] = exp2_ftz(fmaf(s[j][1], sl, -l0)) * (dp[1] - d0);
      s[j][2] = exp2_ftz(fmaf(s[j][2], sl, -l1)) * (dp[2] - d1);
      s[j][3] = exp2_ftz(fmaf(s[j][3], sl, -l1)) * (dp[3] - d1);
    }
    accumulate<D, E>(dq, s, tiles.key(buf));  // dQ += dS K (scaled at the end)
    __syncthreads();
  };
  for (int64_t kt = 0; kt + 1 < key_tiles; ++kt) step(kt, std::false_type{});
  step(key_tiles - 1, std::true_type{});
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

// Blocks (b * NH + h, tile): the device starts blocks in order of x, then y (in practice), so every
// head's longest block starts before any head's second longest, and the last blocks to start are
// the shortest (with the heads on y, the last head's longest blocks started last and ran alone).
dim3 grid_for_tiles(int64_t B, const Dims& dm) {
  const int64_t tiles = (dm.T + kTile - 1) / kTile;
  MT_CHECK(tiles <= 65535 && B * dm.NH <= 0x7fffffff, "flash attention: T=", dm.T, " (", tiles,
           " tiles of ", kTile, ") or B * NH = ", B * dm.NH, " is beyond the launch grid");
  return dim3(static_cast<unsigned>(B * dm.NH), static_cast<unsigned>(tiles));
}

// A half copy (E's type) of an f32 device array for the duration of one call's queued work
// (stream-ordered: freed after the launches, reused only by later work on the stream).
class HalfCopy {
 public:
  HalfCopy(const float* src, int64_t n, DType half, cudaStream_t stream)
      : mem_(static_cast<size_t>(n) * sizeof(h16), stream) {
    cast(mem_.get(), half, src, DType::f32, n, stream);
  }
  const h16* get() const { return mem_.as<const h16>(); }

 private:
  StreamScratch mem_;
};

template <int D, typename E, typename O>
void forward_for(O* out, float* lse, const h16* qkv, int64_t B, Dims dm, int warp_rows,
                 cudaStream_t stream) {
  constexpr size_t bytes = forward_smem<D>();
  // Two fragments a warp hold twice the scores and outputs in registers: heads up to 64 only.
  if constexpr (D <= 64) {
    if (warp_rows == 2 * kRows) {
      allow_smem(flash_forward_kernel<D, 2, E, O>, bytes);
      flash_forward_kernel<D, 2, E, O>
          <<<grid_for_tiles(B, dm), kForwardThreads<2>, bytes, stream>>>(out, lse, qkv, dm);
      MT_CUDA_CHECK_LAUNCH();
      return;
    }
  }
  allow_smem(flash_forward_kernel<D, 1, E, O>, bytes);
  flash_forward_kernel<D, 1, E, O>
      <<<grid_for_tiles(B, dm), kForwardThreads<1>, bytes, stream>>>(out, lse, qkv, dm);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename E, typename O>
void forward_for(O* out, float* lse, const h16* qkv, int64_t B, Dims dm, int warp_rows,
                 cudaStream_t stream) {
  switch (dm.C / dm.NH) {
    case 32:
      return forward_for<32, E>(out, lse, qkv, B, dm, warp_rows, stream);
    case 64:
      return forward_for<64, E>(out, lse, qkv, B, dm, warp_rows, stream);
    default:
      return forward_for<128, E>(out, lse, qkv, B, dm, warp_rows, stream);
  }
}

// Calls f with a null pointer of the element type of `half` (bf16 or f16).
template <typename F>
void with_half_type(DType half, F&& f) {
  MT_CHECK(half == DType::bf16 || half == DType::f16,
           "flash attention: q, k and v are bf16 or f16, got ", dtype_name(half));
  if (half == DType::f16) return f(static_cast<f16*>(nullptr));
  f(static_cast<bf16*>(nullptr));
}

// The kernels copy q, k, v and a half dout in 16-byte pieces and store pairs of outputs and
// gradients (8 bytes of f32, 4 of a half type).
void check_aligned(const void* p, uintptr_t bytes, const char* what) {
  MT_CHECK(reinterpret_cast<uintptr_t>(p) % bytes == 0, "flash attention: ", what, " is not ",
           bytes, "-byte aligned");
}

void check_pairs_aligned(const void* p, DType type, const char* what) {
  check_aligned(p, 2 * dtype_size(type), what);
}

void check_out_type(DType out_type, DType half) {
  MT_CHECK(out_type == DType::f32 || out_type == half, "flash attention: the output is f32 or ",
           dtype_name(half), ", got ", dtype_name(out_type));
}

template <int D, typename E, typename DQ>
void backward_for(DQ* dqkv, const float* dsum, const h16* dout, const h16* qkv, const float* lse,
                  int64_t B, Dims dm, cudaStream_t stream) {
  if (g_atomic_dq) {
    constexpr size_t bytes = backward_kv_smem<D, true>();
    const int64_t n = B * dm.NH * dm.T * D;
    const StreamScratch acc(static_cast<size_t>(n) * sizeof(float), stream);
    MT_CUDA_CHECK(cudaMemsetAsync(acc.get(), 0, static_cast<size_t>(n) * sizeof(float), stream));
    allow_smem(flash_backward_kv_kernel<D, E, DQ, true>, bytes);
    flash_backward_kv_kernel<D, E, DQ, true><<<grid_for_tiles(B, dm), kThreads, bytes, stream>>>(
        dqkv, dout, qkv, lse, dsum, dm, acc.as<float>());
    MT_CUDA_CHECK_LAUNCH();
    dq_from_accumulator_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(
        dqkv, acc.as<float>(), dm, D, n);
    MT_CUDA_CHECK_LAUNCH();
    return;
  }
  constexpr size_t kv_bytes = backward_kv_smem<D, false>(), q_bytes = backward_q_smem<D>();
  allow_smem(flash_backward_kv_kernel<D, E, DQ, false>, kv_bytes);
  allow_smem(flash_backward_q_kernel<D, E, DQ>, q_bytes);
  flash_backward_kv_kernel<D, E, DQ, false><<<grid_for_tiles(B, dm), kThreads, kv_bytes, stream>>>(
      dqkv, dout, qkv, lse, dsum, dm, nullptr);
  MT_CUDA_CHECK_LAUNCH();
  flash_backward_q_kernel<D, E, DQ>
      <<<grid_for_tiles(B, dm), kThreads, q_bytes, stream>>>(dqkv, dout, qkv, lse, dsum, dm);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename E, typename DQ>
void backward_for(DQ* dqkv, const float* dsum, const h16* dout, const h16* qkv, const float* lse,
                  int64_t B, Dims dm, cudaStream_t stream) {
  switch (dm.C / dm.NH) {
    case 32:
      return backward_for<32, E>(dqkv, dsum, dout, qkv, lse, B, dm, stream);
    case 64:
      return backward_for<64, E>(dqkv, dsum, dout, qkv, lse, B, dm, stream);
    default:
      return backward_for<128, E>(dqkv, dsum, dout, qkv, lse, B, dm, stream);
  }
}

// Whether the n 32-bit words at a and b differ anywhere (*flag set to 1; left alone otherwise).
__global__ void differ_kernel(const uint32_t* a, const uint32_t* b, int64_t n, int* flag) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    if (a[i] != b[i]) *flag = 1;
}

// The forward layout chosen for each shape, and what was measured to choose it.
using TuneKey = std::tuple<int, int64_t, int64_t, int64_t, int64_t, int, int>;
std::mutex g_tune_mu;
std::map<TuneKey, int> g_tuned;
std::vector<std::string> g_tune_notes;

// The faster of the two forward layouts for this shape, timed the first time the shape is seen
// (`run(warp_rows)` runs the forward into out and lse): three interleaved rounds, the fastest of
// each. The layouts make the same products in the same order, so their outputs must be the same
// bits; where they are not, the default (16 rows) is kept and a note says so. Two threads meeting
// a new shape at once may both time it (the first choice stays; either has the same bits). Each
// new (B, T) pays a tuning: callers of varying lengths pay it often.
template <typename Run>
int tuned_warp_rows(const TuneKey& key, const void* out, size_t out_bytes, const float* lse,
                    size_t lse_bytes, cudaStream_t stream, Run run) {
  {
    std::lock_guard lock(g_tune_mu);
    if (auto it = g_tuned.find(key); it != g_tuned.end()) return it->second;
  }
  float best[2] = {INFINITY, INFINITY};
  for (int round = 0; round < 3; ++round)
    for (int v = 0; v < 2; ++v) {
      const int rows = kRows * (v + 1);
      run(rows);  // warm: the first launch of a kernel pays for its loading
      Event start(true), end(true);
      start.record(stream);
      run(rows);
      end.record(stream);
      end.synchronize();
      best[v] = std::min(best[v], start.elapsed_ms(end));
    }
  // The same bits from both: the 16-row output kept aside, the 32-row one compared with it.
  run(kRows);
  const StreamScratch kept(out_bytes + lse_bytes + sizeof(int), stream);
  auto* bytes = kept.as<unsigned char>();
  MT_CUDA_CHECK(cudaMemcpyAsync(bytes, out, out_bytes, cudaMemcpyDeviceToDevice, stream));
  MT_CUDA_CHECK(
      cudaMemcpyAsync(bytes + out_bytes, lse, lse_bytes, cudaMemcpyDeviceToDevice, stream));
  int* flag = reinterpret_cast<int*>(bytes + out_bytes + lse_bytes);
  MT_CUDA_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream));
  run(2 * kRows);
  differ_kernel<<<detail::grid_for(static_cast<int64_t>(out_bytes / 4)), detail::kBlock, 0,
                  stream>>>(reinterpret_cast<const uint32_t*>(bytes),
                            static_cast<const uint32_t*>(out), static_cast<int64_t>(out_bytes / 4),
                            flag);
  MT_CUDA_CHECK_LAUNCH();
  differ_kernel<<<detail::grid_for(static_cast<int64_t>(lse_bytes / 4)), detail::kBlock, 0,
                  stream>>>(reinterpret_cast<const uint32_t*>(bytes + out_bytes),
                            reinterpret_cast<const uint32_t*>(lse),
                            static_cast<int64_t>(lse_bytes / 4), flag);
  MT_CUDA_CHECK_LAUNCH();
  int differ = 0;
  MT_CUDA_CHECK(cudaMemcpyAsync(&differ, flag, sizeof(int), cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
  const int chosen = differ == 0 && best[1] < best[0] ? 2 * kRows : kRows;
  const auto& [device, B, T, C, NH, out_type, half] = key;
  std::string note = ::meshtrain::detail::str_cat(
      "B=", B, " T=", T, " C=", C, " NH=", NH, " ", dtype_name(static_cast<DType>(half)), " out ",
      dtype_name(static_cast<DType>(out_type)), ": ", chosen, " rows a warp (16: ", best[0],
      " ms, 32: ", best[1], " ms)",
      differ != 0 ? "; the 32-row layout's output differs from the 16-row one's: kept 16" : "");
  std::lock_guard lock(g_tune_mu);
  g_tuned.emplace(key, chosen);
  g_tune_notes.push_back(std::move(note));
  return chosen;
}

}  // namespace

std::vector<std::string> flash_forward_tuning() {
  std::lock_guard lock(g_tune_mu);
  return g_tune_notes;
}

void set_flash_backward_atomic_dq(bool atomic) {
  g_atomic_dq = atomic;
}

bool flash_backward_atomic_dq() {
  return g_atomic_dq;
}

bool flash_attention_supports(int64_t head_size) {
  return flash_attention_head_size(head_size);
}

void flash_attention_forward(void* out, DType out_type, float* lse, const void* qkv, DType half,
                             int64_t B, int64_t T, int64_t C, int64_t NH, cudaStream_t stream,
                             int warp_rows) {
  const Dims dm = make_dims(T, C, NH);
  with_half_type(half, [&]<typename E>(E*) {
    check_out_type(out_type, half);
    MT_CHECK(warp_rows == 0 || warp_rows == kRows || warp_rows == 2 * kRows,
             "flash attention: a warp owns 16 or 32 query rows (0: the faster), not ", warp_rows);
    if (B <= 0 || T <= 0) return;
    check_aligned(qkv, 16, "qkv");
    check_pairs_aligned(out, out_type, "out");
    const auto* q = static_cast<const h16*>(qkv);
    auto run = [&](int rows) {
      if (out_type == DType::f32)
        return forward_for<E>(static_cast<float*>(out), lse, q, B, dm, rows, stream);
      forward_for<E>(static_cast<E*>(out), lse, q, B, dm, rows, stream);
    };
    if (warp_rows == 0) {
      // Two layouts only for heads up to 64.
      warp_rows = C / NH > 64
                      ? kRows
                      : tuned_warp_rows(TuneKey{current_device(), B, T, C, NH,
                                                static_cast<int>(out_type), static_cast<int>(half)},
                                        out, static_cast<size_t>(B * T * C) * dtype_size(out_type),
                                        lse, static_cast<size_t>(B * NH * T) * 4, stream, run);
    }
    run(warp_rows);
  });
}

void flash_attention_backward(void* dqkv, DType dqkv_type, float* scratch, const void* dout,
                              const void* qkv, DType half, const void* out, DType out_type,
                              const float* lse, int64_t B, int64_t T, int64_t C, int64_t NH,
                              cudaStream_t stream) {
  const Dims dm = make_dims(T, C, NH);
  with_half_type(half, [&]<typename E>(E*) {
    check_out_type(out_type, half);
    MT_CHECK(dqkv_type == DType::f32 || dqkv_type == half,
             "flash attention: the gradient of q, k, v is f32 or ", dtype_name(half), ", got ",
             dtype_name(dqkv_type));
    if (B <= 0 || T <= 0) return;
    check_aligned(qkv, 16, "qkv");
    check_pairs_aligned(dqkv, dqkv_type, "dqkv");
    if (out_type == half) check_aligned(dout, 16, "dout");
    const int D = static_cast<int>(C / NH);
    const int64_t rows = B * T * NH;
    constexpr int kDotBlock = 256;
    const int64_t dot_blocks = (rows + kDotBlock / detail::kWarp - 1) / (kDotBlock / detail::kWarp);
    MT_CHECK(dot_blocks <= 0x7fffffff, "flash attention: ", rows,
             " rows of heads are beyond one launch's grid");
    const auto blocks = static_cast<unsigned>(dot_blocks);
    detail::with_float_type(out_type, "flash attention: the output", [&]<typename O>(O*) {
      flash_backward_dot_kernel<<<blocks, kDotBlock, 0, stream>>>(
          scratch, static_cast<const O*>(dout), static_cast<const O*>(out), dm, D, rows);
      MT_CUDA_CHECK_LAUNCH();
    });
    const auto* q = static_cast<const h16*>(qkv);
    // The products read half tiles: an f32 dout (outside autocast's half output) is cast once.
    std::optional<HalfCopy> copy;
    if (out_type == DType::f32)
      copy.emplace(static_cast<const float*>(dout), B * T * C, half, stream);
    const h16* g = copy ? copy->get() : static_cast<const h16*>(dout);
    if (dqkv_type == DType::f32)
      return backward_for<E>(static_cast<float*>(dqkv), scratch, g, q, lse, B, dm, stream);
    backward_for<E>(static_cast<E*>(dqkv), scratch, g, q, lse, B, dm, stream);
  });
}

}  // namespace meshtrain::cuda
