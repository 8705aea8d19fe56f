// The GEMM-based attention: layout moves and softmax in attention_parts.cu, products through
// cuda::matmul (row-major, batched over the B * NH heads with one stride per operand).
#include "meshtrain/cuda/kernels/attention_gemm.h"

#include <cmath>

#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernels/attention_parts.h"
#include "meshtrain/cuda/kernels/gemm.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

// `count` arrays of n floats each, stream-ordered: freed when the call's work is queued, reusable
// by later work on the same stream.
class HeadScratch {
 public:
  HeadScratch(int count, int64_t n, cudaStream_t stream)
      : n_(n), mem_(static_cast<size_t>(count) * static_cast<size_t>(n) * sizeof(float), stream) {}
  float* operator[](int i) const { return mem_.as<float>() + static_cast<int64_t>(i) * n_; }

 private:
  int64_t n_;
  StreamScratch mem_;
};

// A product over the B * NH heads: out[M, N] = alpha * op(a) @ op(b) per head.
void per_head(float* out, const float* a, const float* b, int64_t heads, int64_t M, int64_t N,
              int64_t K, bool trans_a, bool trans_b, float alpha, cudaStream_t stream) {
  matmul(out, a, b, nullptr, DType::f32, gemm_shape(M, N, K, trans_a, trans_b, heads, M * K, K * N),
         alpha, 0.0f, stream);
}

}  // namespace

void attention_forward_gemm(float* out, float* att, const float* qkv, int64_t B, int64_t T,
                            int64_t C, int64_t NH, cudaStream_t stream) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not divisible by NH=", NH);
  if (B <= 0 || T <= 0) return;
  const int64_t HS = C / NH, heads = B * NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  HeadScratch s(4, B * T * C, stream);
  float *q = s[0], *k = s[1], *v = s[2], *y = s[3];
  split_qkv(q, k, v, qkv, B, T, C, NH, stream);
  per_head(att, q, k, heads, T, T, HS, false, true, scale, stream);  // scores[t, s] = q_t . k_s
  causal_softmax_forward(att, heads * T, T, stream);
  per_head(y, att, v, heads, T, HS, T, false, false, 1.0f, stream);  // y_t = sum_s att[t, s] v_s
  merge_heads(out, y, B, T, C, NH, stream);
}

void attention_backward_gemm(float* dqkv, float* scratch, const float* dout, const float* qkv,
                             const float* att, int64_t B, int64_t T, int64_t C, int64_t NH,
                             cudaStream_t stream) {
  MT_CHECK(NH > 0 && C % NH == 0, "attention: C=", C, " is not divisible by NH=", NH);
  if (B <= 0 || T <= 0) return;
  const int64_t HS = C / NH, heads = B * NH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  HeadScratch s(7, B * T * C, stream);
  float *q = s[0], *k = s[1], *v = s[2], *dy = s[3], *dq = s[4], *dk = s[5], *dv = s[6];
  split_qkv(q, k, v, qkv, B, T, C, NH, stream);
  split_heads(dy, dout, B, T, C, NH, stream);
  float* g = scratch;  // [heads, T, T]: d(att), then d(scores)
  per_head(g, dy, v, heads, T, T, HS, false, true, 1.0f, stream);     // d(att) = dy v^T
  per_head(dv, att, dy, heads, T, HS, T, true, false, 1.0f, stream);  // dv = att^T dy
  causal_softmax_backward(g, att, heads * T, T, stream);
  per_head(dq, g, k, heads, T, HS, T, false, false, scale, stream);  // dq = d(scores) k * scale
  per_head(dk, g, q, heads, T, HS, T, true, false, scale, stream);   // dk = d(scores)^T q * scale
  merge_qkv(dqkv, dq, dk, dv, B, T, C, NH, stream);
}

}  // namespace meshtrain::cuda
