// Grid-stride loops over B*T*C elements; consecutive threads walk the channels of one token, so
// the table rows are read and written coalesced. The token table's gradient sorts the positions
// by token (a stable radix sort: a token's positions stay in order) and sums each token's rows in
// position order, one block a token, with no atomics: the same bits on every run, the CPU's.
#include <cub/device/device_radix_sort.cuh>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/embedding.h"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

__global__ void embedding_forward_kernel(float* out, const int32_t* idx, const float* wte,
                                         const float* wpe, int64_t T, int64_t C, int64_t V,
                                         int64_t total) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t bt = i / C;
    const int64_t c = i % C;
    const int64_t t = bt % T;
    const int32_t tok = idx[bt];
    out[i] = (tok >= 0 && tok < V) ? wte[tok * C + c] + wpe[t * C + c] : NAN;
  }
}

__global__ void vocab_lookup_kernel(float* out, const int32_t* idx, const float* table, int64_t C,
                                    int64_t begin, int64_t valid, int64_t total) {
  MT_GRID_STRIDE(i, total) {
    const int64_t row = int64_t{idx[i / C]} - begin;
    out[i] = row >= 0 && row < valid ? table[row * C + i % C] : 0.0f;
  }
}

__global__ void iota_kernel(int32_t* out, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = static_cast<int32_t>(i);
}

// Block i: if sorted position i is its token's first, dwte[token - begin] += the sum of dout
// over the token's positions (pos[i], pos[i + 1], ... while the token lasts), added up in that
// order from zero; tokens outside [begin, begin + valid) add nothing. A token's positions end
// where the sorted tokens change (a binary search). Rows are read eight ahead of the sum, which
// keeps its order.
__global__ void embedding_wte_backward_sorted_kernel(float* dwte, const float* dout,
                                                     const int32_t* tokens, const int32_t* pos,
                                                     int64_t n, int64_t C, int64_t begin,
                                                     int64_t valid) {
  const int64_t i = blockIdx.x;
  const int32_t tok = tokens[i];
  const int64_t row = int64_t{tok} - begin;
  if ((i > 0 && tokens[i - 1] == tok) || row < 0 || row >= valid) return;
  int64_t lo = i + 1, hi = n;
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (tokens[mid] == tok)
      lo = mid + 1;
    else
      hi = mid;
  }
  const int64_t end = lo;
  constexpr int kAhead = 8;
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
    float s = 0.0f;
    int64_t j = i;
    for (; j + kAhead <= end; j += kAhead) {
      float v[kAhead];
#pragma unroll
      for (int k = 0; k < kAhead; ++k) v[k] = dout[int64_t{pos[j + k]} * C + c];
#pragma unroll
      for (int k = 0; k < kAhead; ++k) s += v[k];
    }
    for (; j < end; ++j) s += dout[int64_t{pos[j]} * C + c];
    dwte[row * C + c] += s;
  }
}

__global__ void embedding_wpe_backward_kernel(float* dwpe, const float* dout, int64_t B, int64_t T,
                                              int64_t C) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < T * C;
       i += int64_t{gridDim.x} * blockDim.x) {
    float s = 0.0f;
    for (int64_t b = 0; b < B; ++b) s += dout[b * T * C + i];
    dwpe[i] += s;
  }
}

// dtable[idx[i] - begin] += dout[i] for the n positions whose id is in [begin, begin + valid):
// the positions sorted by id (a stable radix sort keeps each id's positions in order), then one
// block an id.
void sorted_rows_backward(float* dtable, const float* dout, const int32_t* idx, int64_t n,
                          int64_t C, int64_t begin, int64_t valid, cudaStream_t stream) {
  if (n <= 0 || C <= 0) return;
  MT_CHECK(n <= 0x7fffffff, "embedding: ", n, " positions are beyond the sort's reach");
  size_t sort_bytes = 0;
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, sort_bytes, idx, static_cast<int32_t*>(nullptr),
      static_cast<const int32_t*>(nullptr), static_cast<int32_t*>(nullptr), n, 0, 32, stream));
  // Sorted tokens, positions in order, positions sorted by token, then the sort's scratch.
  const size_t ints = static_cast<size_t>(n) * sizeof(int32_t);
  const size_t aligned = (ints + 255) / 256 * 256;
  const StreamScratch scratch(3 * aligned + sort_bytes, stream);
  auto* base = scratch.as<unsigned char>();
  auto* tokens = reinterpret_cast<int32_t*>(base);
  auto* order = reinterpret_cast<int32_t*>(base + aligned);
  auto* pos = reinterpret_cast<int32_t*>(base + 2 * aligned);
  iota_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(order, n);
  MT_CUDA_CHECK_LAUNCH();
  MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * aligned, sort_bytes, idx, tokens, order,
                                                pos, n, 0, 32, stream));
  embedding_wte_backward_sorted_kernel<<<static_cast<unsigned>(n), 256, 0, stream>>>(
      dtable, dout, tokens, pos, n, C, begin, valid);
  MT_CUDA_CHECK_LAUNCH();
}

}  // namespace

void gpt_embedding_forward(float* out, const int32_t* idx, const float* wte, const float* wpe,
                           int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream) {
  const int64_t total = B * T * C;
  if (total <= 0) return;
  embedding_forward_kernel<<<detail::grid_for(total), detail::kBlock, 0, stream>>>(
      out, idx, wte, wpe, T, C, V, total);
  MT_CUDA_CHECK_LAUNCH();
}

void gpt_embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* idx,
                            int64_t B, int64_t T, int64_t C, int64_t V, cudaStream_t stream) {
  const int64_t total = B * T * C;
  if (total <= 0) return;
  if (dwte != nullptr) sorted_rows_backward(dwte, dout, idx, B * T, C, 0, V, stream);
  if (dwpe != nullptr) {
    embedding_wpe_backward_kernel<<<detail::grid_for(T * C), detail::kBlock, 0, stream>>>(
        dwpe, dout, B, T, C);
    MT_CUDA_CHECK_LAUNCH();
  }
}

void vocab_lookup_forward(float* out, const int32_t* idx, const float* table, int64_t N, int64_t C,
                          int64_t begin, int64_t valid, cudaStream_t stream) {
  const int64_t total = N * C;
  if (total <= 0) return;
  vocab_lookup_kernel<<<detail::grid_for(total), detail::kBlock, 0, stream>>>(out, idx, table, C,
                                                                              begin, valid, total);
  MT_CUDA_CHECK_LAUNCH();
}

void vocab_lookup_backward(float* dtable, const float* dout, const int32_t* idx, int64_t N,
                           int64_t C, int64_t begin, int64_t valid, cudaStream_t stream) {
  sorted_rows_backward(dtable, dout, idx, N, C, begin, valid, stream);
}

}  // namespace meshtrain::cuda
