// Two passes with a fixed geometry: kSumSquaresScratch blocks each sum a grid-stride share of the
// elements into one double (a fixed tree inside the block), then one block combines the partial
// sums in a fixed tree. Neither depends on timing, so the result is the same on every run.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/launch.cuh"
#include "meshtrain/cuda/kernels/sum_squares.h"

namespace meshtrain::cuda {
namespace {

constexpr int kThreads = 256;

__device__ inline double block_sum_double(double v, double* shared) {
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s /= 2) {
    if (static_cast<int>(threadIdx.x) < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  return shared[0];
}

// Part `part` of kSumSquaresScratch of x's elements, into partial[part].
__device__ void partial_sum(double* partial, const float* x, int64_t n, int64_t part) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t i = part * kThreads + threadIdx.x; i < n; i += kSumSquaresScratch * kThreads) {
    const double v = x[i];
    acc += v * v;
  }
  const double total = block_sum_double(acc, shared);
  if (threadIdx.x == 0) partial[part] = total;
}

__device__ void final_sum(double* out, const double* partial) {
  __shared__ double shared[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < kSumSquaresScratch; i += kThreads) acc += partial[i];
  const double total = block_sum_double(acc, shared);
  if (threadIdx.x == 0) *out = total;
}

__global__ void sum_squares_partial_kernel(double* partial, const float* x, int64_t n) {
  partial_sum(partial, x, n, blockIdx.x);
}

__global__ void sum_squares_final_kernel(double* out, const double* partial) {
  final_sum(out, partial);
}

// Arrays per launch: their pointers and sizes travel as the kernels' argument.
constexpr int kMany = 64;
struct ManyArrays {
  const float* x[kMany];
  int64_t n[kMany];
};

// Block (part, i): part `part` of array i, into scratch row i.
__global__ void sum_squares_partial_many_kernel(double* partial, ManyArrays a) {
  partial_sum(partial + blockIdx.y * kSumSquaresScratch, a.x[blockIdx.y], a.n[blockIdx.y],
              blockIdx.x);
}

__global__ void sum_squares_final_many_kernel(double* out, const double* partial) {
  final_sum(out + blockIdx.x, partial + blockIdx.x * kSumSquaresScratch);
}

}  // namespace

void sum_squares(double* out, double* scratch, const float* x, int64_t n, cudaStream_t stream) {
  sum_squares_partial_kernel<<<static_cast<unsigned>(kSumSquaresScratch), kThreads, 0, stream>>>(
      scratch, x, n);
  MT_CUDA_CHECK_LAUNCH();
  sum_squares_final_kernel<<<1, kThreads, 0, stream>>>(out, scratch);
  MT_CUDA_CHECK_LAUNCH();
}

void sum_squares_many(double* out, double* scratch, const float* const* xs, const int64_t* ns,
                      int64_t count, cudaStream_t stream) {
  for (int64_t begin = 0; begin < count; begin += kMany) {
    const int64_t k = count - begin < kMany ? count - begin : kMany;
    ManyArrays a{};
    for (int64_t i = 0; i < k; ++i) {
      a.x[i] = xs[begin + i];
      a.n[i] = ns[begin + i];
    }
    double* partial = scratch + begin * kSumSquaresScratch;
    sum_squares_partial_many_kernel<<<dim3(static_cast<unsigned>(kSumSquaresScratch),
                                           static_cast<unsigned>(k)),
                                      kThreads, 0, stream>>>(partial, a);
    MT_CUDA_CHECK_LAUNCH();
    sum_squares_final_many_kernel<<<static_cast<unsigned>(k), kThreads, 0, stream>>>(out + begin,
                                                                                     partial);
    MT_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace meshtrain::cuda
