// Each output element depends only on its own inputs (elementwise_map.cuh); the column sums of
// bias gradients are column_sums.cuh's.
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/block_plan.cuh"
#include "meshtrain/cuda/kernels/column_sums.cuh"
#include "meshtrain/cuda/kernels/elementwise.h"
#include "meshtrain/cuda/kernels/elementwise_map.cuh"
#include "meshtrain/cuda/kernels/f32_access.cuh"
#include "meshtrain/cuda/kernels/launch.cuh"

namespace meshtrain::cuda {
namespace {

struct AddOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MulOp {
  __device__ float operator()(float a, float b) const { return a * b; }
};
struct ScaleOp {
  float s;
  __device__ float operator()(float a) const { return a * s; }
};
// y + alpha * x, as y[i] += alpha * x[i].
struct AxpyOp {
  float alpha;
  __device__ float operator()(float y, float x) const { return y + alpha * x; }
};

// Arrays per launch of scale_many: their descriptors travel as the kernel's argument (under
// 4 KiB); each block takes kManyChunk elements of one array.
constexpr int kManyArrays = 64;
constexpr int64_t kManyChunk = 64 * 1024;

struct ManyArrays {
  float* x[kManyArrays];
  detail::BlockPlan<kManyArrays, kManyChunk> plan;
};

__global__ void scale_many_kernel(ManyArrays as, float s) {
  int64_t begin, end;
  float* x = as.x[as.plan.locate(begin, end)];
  for (int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) x[k] = x[k] * s;
}

// Element (r, c) of a row-major [N, C] array.
template <typename T>
struct ElementOf {
  const T* a;
  int64_t C;
  __device__ void operator()(int64_t r, int64_t c, float* v) const {
    v[0] = detail::load_f32(a, r * C + c);
  }
};

__global__ void add_rows_kernel(float* out, const float* a, const float* row, int64_t n,
                                int64_t width) {
  MT_GRID_STRIDE(i, n) out[i] = a[i] + row[i % width];
}

__global__ void sum_dim_kernel(float* out, const float* inp, int64_t mid, int64_t inner,
                               int64_t total) {
  MT_GRID_STRIDE(k, total) {
    const int64_t o = k / inner, j = k % inner;
    const float* p = inp + o * mid * inner + j;
    float s = 0.0f;
    for (int64_t m = 0; m < mid; ++m) s += p[m * inner];
    out[k] = s;
  }
}

}  // namespace

void add_rows(float* out, const float* a, const float* row, int64_t n, int64_t width,
              cudaStream_t stream) {
  if (n <= 0 || width <= 0) return;
  add_rows_kernel<<<detail::grid_for(n), detail::kBlock, 0, stream>>>(out, a, row, n, width);
  MT_CUDA_CHECK_LAUNCH();
}

void sum_dim(float* out, const float* inp, int64_t outer, int64_t mid, int64_t inner,
             cudaStream_t stream) {
  const int64_t total = outer * inner;
  if (total <= 0) return;
  sum_dim_kernel<<<detail::grid_for(total), detail::kBlock, 0, stream>>>(out, inp, mid, inner,
                                                                         total);
  MT_CUDA_CHECK_LAUNCH();
}

void add(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  detail::map(out, a, b, n, AddOp{}, stream);
}

void mul(float* out, const float* a, const float* b, int64_t n, cudaStream_t stream) {
  detail::map(out, a, b, n, MulOp{}, stream);
}

void scale(float* out, const float* a, float s, int64_t n, cudaStream_t stream) {
  detail::map(out, a, n, ScaleOp{s}, stream);
}

void scale_many(float* const* xs, const int64_t* ns, int64_t count, float s, cudaStream_t stream) {
  ManyArrays as{};
  auto launch = [&] {
    if (as.plan.count == 0) return;
    scale_many_kernel<<<as.plan.blocks(), detail::kBlock, 0, stream>>>(as, s);
    MT_CUDA_CHECK_LAUNCH();
    as = ManyArrays{};
  };
  for (int64_t i = 0; i < count; ++i) {
    if (ns[i] <= 0) continue;
    as.x[as.plan.add(ns[i])] = xs[i];
    if (as.plan.full()) launch();
  }
  launch();
}

void axpy(float* y, const float* x, float alpha, int64_t n, cudaStream_t stream) {
  detail::map(y, y, x, n, AxpyOp{alpha}, stream);
}

void column_sum_accumulate(float* out, const float* a, int64_t N, int64_t C, cudaStream_t stream) {
  detail::column_sums_to<1>({out}, N, C, ElementOf<float>{a, C}, true, stream);
}

void column_sums(float* out, const void* a, DType type, int64_t N, int64_t C, cudaStream_t stream) {
  detail::with_float_type(type, "column sums: the array", [&]<typename T>(T*) {
    detail::column_sums_to<1>({out}, N, C, ElementOf<T>{static_cast<const T*>(a), C}, false,
                              stream);
  });
}

void column_sum_accumulate(float* out, const void* a, DType type, int64_t N, int64_t C,
                           cudaStream_t stream) {
  detail::with_float_type(type, "column sums: the array", [&]<typename T>(T*) {
    detail::column_sums_to<1>({out}, N, C, ElementOf<T>{static_cast<const T*>(a), C}, true, stream);
  });
}

}  // namespace meshtrain::cuda
