// See gemm_onednn.h. The cache is per thread, like the convolutions' (conv2d_onednn.cpp): ranks
// that run as threads, and the threads of matmul_batched's parallel loop, never share a
// primitive's memory objects.
#include "meshtrain/tensor/cpu/gemm_onednn.h"

#include <oneapi/dnnl/dnnl.hpp>

#include <cstring>
#include <unordered_map>

#include "meshtrain/tensor/cpu/onednn_context.h"

namespace meshtrain::cpu::gemm_onednn {
namespace {

using dnnl::memory;

struct Key {
  bool trans_a, trans_b;
  int64_t M, N, K, lda, ldb, ldc;
  float alpha, beta;
  bool operator==(const Key& o) const {
    return trans_a == o.trans_a && trans_b == o.trans_b && M == o.M && N == o.N && K == o.K &&
           lda == o.lda && ldb == o.ldb && ldc == o.ldc && alpha == o.alpha && beta == o.beta;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = (k.trans_a ? 1u : 0u) | (k.trans_b ? 2u : 0u);
    for (int64_t v : {k.M, k.N, k.K, k.lda, k.ldb, k.ldc})
      h = h * 1000003u ^ static_cast<size_t>(v);
    uint32_t fa, fb;
    std::memcpy(&fa, &k.alpha, 4);
    std::memcpy(&fb, &k.beta, 4);
    return (h * 1000003u ^ fa) * 1000003u ^ fb;
  }
};

struct Product {
  dnnl::matmul primitive;
  memory a, b, c;
};

// The kernel oneDNN chooses for the product k. op(a) is [M, K] and op(b) is [K, N]; a transposed
// operand is the same array read with its strides swapped.
// M or K of kRuntime: a primitive for any value, given at each call.
constexpr int64_t kRuntime = -1;

memory::dim dim(int64_t v) {
  return v == kRuntime ? DNNL_RUNTIME_DIM_VAL : v;
}

// The operands' descriptions for dimensions M and K (real values, or kRuntime in a key).
struct Descs {
  memory::desc a, b, c;
};
Descs descs(const Key& k, int64_t M, int64_t K) {
  return {memory::desc({dim(M), dim(K)}, memory::data_type::f32,
                       k.trans_a ? memory::dims{1, k.lda} : memory::dims{k.lda, 1}),
          memory::desc({dim(K), k.N}, memory::data_type::f32,
                       k.trans_b ? memory::dims{1, k.ldb} : memory::dims{k.ldb, 1}),
          memory::desc({dim(M), k.N}, memory::data_type::f32, memory::dims{k.ldc, 1})};
}

thread_local int rows_vary_depth = 0;

dnnl::matmul::primitive_desc describe(const Key& k) {
  const auto [a, b, c] = descs(k, k.M, k.K);
  dnnl::primitive_attr attr;
  if (k.alpha != 1.0f) attr.set_output_scales(0, {k.alpha});
  if (k.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(k.beta);
    attr.set_post_ops(ops);
  }
  return dnnl::matmul::primitive_desc(dnnl::matmul::desc(a, b, c), attr, onednn_engine());
}

Product make(const Key& k) {
  const dnnl::matmul::primitive_desc pd = describe(k);
  // A primitive with a run-time dimension gets its memory objects at each call.
  if (k.M == kRuntime || k.K == kRuntime) return Product{dnnl::matmul(pd), {}, {}, {}};
  return Product{dnnl::matmul(pd), memory(pd.src_desc(), onednn_engine(), DNNL_MEMORY_NONE),
                 memory(pd.weights_desc(), onednn_engine(), DNNL_MEMORY_NONE),
                 memory(pd.dst_desc(), onednn_engine(), DNNL_MEMORY_NONE)};
}

Product& product(const Key& k) {
  thread_local std::unordered_map<Key, Product, KeyHash> cache;
  auto it = cache.find(k);
  if (it != cache.end()) return it->second;
  if (cache.size() >= kOnednnMaxCached) cache.clear();
  return cache.emplace(k, make(k)).first->second;
}

}  // namespace

RowsVary::RowsVary() {
  ++rows_vary_depth;
}

RowsVary::~RowsVary() {
  --rows_vary_depth;
}

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* a,
          int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (rows_vary_depth > 0) {
    // The rows are M of a product of them, and K of a weight gradient (op(a) = a^T: the rows'
    // gradients against their inputs); the other dimensions are the layer's.
    const Key k{trans_a, trans_b, kRuntime, N, trans_a ? kRuntime : K, lda, ldb, ldc, alpha, beta};
    Product& p = product(k);
    const auto [da, db, dc] = descs(k, M, K);
    memory ma(da, onednn_engine(), const_cast<float*>(a)),
        mb(db, onednn_engine(), const_cast<float*>(b)), mc(dc, onednn_engine(), c);
    p.primitive.execute(onednn_stream(),
                        {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    onednn_stream().wait();
    return;
  }
  Product& p = product(Key{trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta});
  p.a.set_data_handle(const_cast<float*>(a));
  p.b.set_data_handle(const_cast<float*>(b));
  p.c.set_data_handle(c);
  p.primitive.execute(onednn_stream(),
                      {{DNNL_ARG_SRC, p.a}, {DNNL_ARG_WEIGHTS, p.b}, {DNNL_ARG_DST, p.c}});
  onednn_stream().wait();
}

std::string config() {
  // Asking oneDNN means building a primitive descriptor; the answer does not change within a
  // process, and every checkpoint records it.
  static const std::string described = [] {
    const dnnl_version_t* v = dnnl_version();
    // A linear layer's product (the weight transposed), as typical as any.
    const Key k{false, true, 256, 256, 256, 256, 256, 256, 1.0f, 0.0f};
    return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
           std::to_string(v->patch) + " " + describe(k).impl_info_str();
  }();
  return described;
}

}  // namespace meshtrain::cpu::gemm_onednn
