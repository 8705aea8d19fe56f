// Per-column sums over the rows of an [N, C] array, for K quantities at once (a bias gradient:
// K = 1; LayerNorm's weight and bias gradients: K = 2). A bias has few columns (768 for GPT-2)
// but the rows are the batch's tokens (8192 and more), so one block per 32 columns leaves the
// device nearly idle; here the rows are cut into chunks as well, a block per (32 columns, chunk)
// writes partial sums, and a second kernel adds the chunks in order. No atomics: the same bits on
// every run for the same shapes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdint>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernels/column_sum_plan.h"

namespace meshtrain::cuda::detail {

constexpr int kColumnSumRowThreads = 8;

template <int K>
struct ColumnOutputs {
  float* out[K];
};

// value(r, c, v) writes the K values of element (r, c).
template <int K, typename Value>
__global__ void column_partials_kernel(float* partial, int64_t N, int64_t C, int64_t chunk_rows,
                                       Value value) {
  __shared__ float red[K][kColumnSumRowThreads][33];
  const int64_t c = blockIdx.x * int64_t{32} + threadIdx.x;
  const int64_t r_begin = blockIdx.y * chunk_rows;
  const int64_t r_end = r_begin + chunk_rows < N ? r_begin + chunk_rows : N;
  float s[K];
#pragma unroll
  for (int k = 0; k < K; ++k) s[k] = 0.0f;
  if (c < C) {
    for (int64_t r = r_begin + threadIdx.y; r < r_end; r += kColumnSumRowThreads) {
      float v[K];
      value(r, c, v);
#pragma unroll
      for (int k = 0; k < K; ++k) s[k] += v[k];
    }
  }
#pragma unroll
  for (int k = 0; k < K; ++k) red[k][threadIdx.y][threadIdx.x] = s[k];
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      float t = 0.0f;
      for (int y = 0; y < kColumnSumRowThreads; ++y) t += red[k][y][threadIdx.x];
      partial[(k * int64_t{gridDim.y} + blockIdx.y) * C + c] = t;
    }
  }
}

// Adds the chunks' partial sums in order and writes them to outs (or, with `accumulate`, adds
// them to what outs hold: a fresh output needs no zero-fill of its own).
template <int K>
__global__ void column_finish_kernel(ColumnOutputs<K> outs, const float* partial, int64_t chunks,
                                     int64_t C, bool accumulate) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    if (outs.out[k] == nullptr) continue;
    float t = 0.0f;
    for (int64_t j = 0; j < chunks; ++j) t += partial[(k * chunks + j) * C + c];
    outs.out[k][c] = accumulate ? outs.out[k][c] + t : t;
  }
}

// outs[k][c] = (with `accumulate`: +=) the sum over r of value(r, c)[k]; a null output is left
// out. No rows: zeros written (nothing added).
template <int K, typename Value>
void column_sums_to(const std::array<float*, K>& outs, int64_t N, int64_t C, Value value,
                    bool accumulate, cudaStream_t stream) {
  if (C <= 0) return;
  if (N <= 0) {
    if (!accumulate)
      for (float* o : outs)
        if (o != nullptr)
          MT_CUDA_CHECK(cudaMemsetAsync(o, 0, static_cast<size_t>(C) * sizeof(float), stream));
    return;
  }
  const auto [chunk_rows, chunks] = column_sum_plan(N, C);
  const StreamScratch scratch(static_cast<size_t>(K * chunks * C) * sizeof(float), stream);
  auto* partial = scratch.as<float>();
  const dim3 grid(static_cast<unsigned>((C + 31) / 32), static_cast<unsigned>(chunks));
  column_partials_kernel<K, Value>
      <<<grid, dim3(32, kColumnSumRowThreads), 0, stream>>>(partial, N, C, chunk_rows, value);
  MT_CUDA_CHECK_LAUNCH();
  ColumnOutputs<K> o;
  for (int k = 0; k < K; ++k) o.out[k] = outs[static_cast<size_t>(k)];
  column_finish_kernel<K><<<static_cast<unsigned>((C + 255) / 256), 256, 0, stream>>>(
      o, partial, chunks, C, accumulate);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace meshtrain::cuda::detail
