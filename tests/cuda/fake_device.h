// A CUDA device played by the host, for testing the device plumbing on machines without a GPU:
// FakeDeviceAllocator gives "cuda" tensors host memory (poisoned, so a missing copy shows) and
// FakeDeviceKernels answers the device kernel table with the CPU kernels, called exactly as the CPU
// path of autograd calls them, so a model on the fake device must give the CPU's bits. Each table
// entry counts its calls, so a test can tell that an op really went through the device path. Both
// may be used from several threads at once (thread ranks of a group).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/tensor/cpu/batch_norm.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/cpu/kernels.h"
#include "meshtrain/tensor/cpu/pool2d.h"
#include "meshtrain/tensor/cpu/relu.h"
#include "meshtrain/tensor/cpu/sgd.h"
#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/storage.h"
#include "meshtrain/tensor/tensor.h"
#include "tests/cuda/attention_reference.h"

namespace meshtrain::test {

class FakeDeviceAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Device device) override {
    EXPECT_FALSE(device.is_cpu());
    void* p = std::malloc(nbytes == 0 ? 1 : nbytes);
    if (poison) std::memset(p, 0xAB, nbytes);
    std::lock_guard lock(mu_);
    live[p] = device.index;
    extent_[p] = nbytes;
    live_bytes_ += nbytes;
    peak_bytes_ = std::max(peak_bytes_, live_bytes_);
    return p;
  }
  void deallocate(void* p, size_t nbytes, Device device) override {
    {
      std::lock_guard lock(mu_);
      EXPECT_EQ(live.at(p), device.index);
      live.erase(p);
      extent_.erase(p);
      live_bytes_ -= nbytes;
    }
    std::free(p);
  }
  // Device bytes held now, and at most since reset_peak() (what the caching allocator's
  // allocated / peak statistics give on a GPU, without its rounding).
  size_t live_bytes() {
    std::lock_guard lock(mu_);
    return live_bytes_;
  }
  size_t peak_bytes() {
    std::lock_guard lock(mu_);
    return peak_bytes_;
  }
  void reset_peak() {
    std::lock_guard lock(mu_);
    peak_bytes_ = live_bytes_;
  }
  // Whether [p, p + nbytes) lies in one live allocation: device memory, where a GPU's group
  // must be handed its buffers.
  bool owns(const void* p, size_t nbytes) {
    std::lock_guard lock(mu_);
    auto it = extent_.upper_bound(const_cast<void*>(p));
    if (it == extent_.begin()) return false;
    --it;
    const auto* base = static_cast<const char*>(it->first);
    const auto* q = static_cast<const char*>(p);
    return q >= base && q + nbytes <= base + it->second;
  }
  void copy(void* dst, Device dst_device, const void* src, Device src_device,
            size_t nbytes) override {
    EXPECT_FALSE(dst_device.is_cpu() && src_device.is_cpu());
    {
      std::lock_guard lock(mu_);
      ++copies;
      if (dst_device.is_cpu()) ++downloads;
    }
    std::memcpy(dst, src, nbytes);
  }
  void zero(void* p, size_t nbytes, Device) override {
    {
      std::lock_guard lock(mu_);
      ++zeros;
    }
    std::memset(p, 0, nbytes);
  }
  std::map<void*, int> live;
  // False: memory is handed out untouched (large blocks then take no host memory until used).
  bool poison = true;
  int copies = 0;
  int downloads = 0;  // copies to the host: the host waits for the device on a GPU
  int zeros = 0;

 private:
  std::mutex mu_;
  std::map<void*, size_t> extent_;  // live allocations' sizes
  size_t live_bytes_ = 0;
  size_t peak_bytes_ = 0;
};

class FakeDeviceKernels final : public DeviceKernels {
 public:
  std::map<std::string, int> calls;
  // False: the kernels a GPT step spends its time in (the half and f32 products, flash attention,
  // the layer norms, GELU, the cross-entropy, the embedding, the elementwise ops, the
  // multi-tensor AdamW) only count their calls and leave their outputs unwritten; the rest (the
  // GEMM attention of other head sizes, the sums of squares, the vision kernels, the
  // single-tensor optimizer steps) still compute. Tensors are
  // allocated and freed as before, so a test can count the device memory of a step far too large
  // to compute here.
  bool compute = true;

  void add(Device d, float* out, const float* a, const float* b, int64_t n) override {
    if (!hit(d, "add")) return;
    cpu::add(out, a, b, n);
  }
  void add_rows(Device d, float* out, const float* a, const float* row, int64_t n,
                int64_t width) override {
    if (!hit(d, "add_rows")) return;
    cpu::add_rows(out, a, row, n, width);
  }
  void sum_dim(Device d, float* out, const float* inp, int64_t outer, int64_t mid,
               int64_t inner) override {
    if (!hit(d, "sum_dim")) return;
    cpu::sum_dim(out, inp, outer, mid, inner);
  }
  void mul(Device d, float* out, const float* a, const float* b, int64_t n) override {
    if (!hit(d, "mul")) return;
    cpu::mul(out, a, b, n);
  }
  void scale(Device d, float* out, const float* a, float s, int64_t n) override {
    if (!hit(d, "scale")) return;
    cpu::scale(out, a, s, n);
  }
  void scale_many(Device d, float* const* xs, const int64_t* ns, int64_t count, float s) override {
    if (!hit(d, "scale_many")) return;
    for (int64_t i = 0; i < count; ++i) cpu::scale(xs[i], xs[i], s, ns[i]);
  }
  void axpy(Device d, float* y, const float* x, float alpha, int64_t n) override {
    if (!hit(d, "axpy")) return;
    cpu::axpy(y, x, alpha, n);
  }
  void cast(Device d, void* dst, DType dst_type, const void* src, DType src_type,
            int64_t n) override {
    if (!hit(d, "cast")) return;
    convert(src, src_type, dst, dst_type, static_cast<size_t>(n));
  }
  double sum_squares(Device d, const float* x, int64_t n) override {
    hit(d, "sum_squares");
    // The CPU reference itself, on a host copy, so that the order of summation is the same.
    return ops::sum_squares(Tensor::from_vector(std::vector<float>(x, x + n), {n}));
  }
  void sum_squares_each(Device d, const float* const* xs, const int64_t* ns, int64_t count,
                        double* out) override {
    hit(d, "sum_squares_each");
    for (int64_t i = 0; i < count; ++i)
      out[i] =
          ops::sum_squares(Tensor::from_vector(std::vector<float>(xs[i], xs[i] + ns[i]), {ns[i]}));
  }
  void sum_squares_each_on_device(Device d, const float* const* xs, const int64_t* ns,
                                  int64_t count, double* out) override {
    if (!hit(d, "sum_squares_each_on_device")) return;
    for (int64_t i = 0; i < count; ++i)
      out[i] =
          ops::sum_squares(Tensor::from_vector(std::vector<float>(xs[i], xs[i] + ns[i]), {ns[i]}));
  }
  void step_gate(Device d, cpu::StepGate* out, const float* losses, int64_t accum,
                 const double* pre, int64_t n_pre, const double* sums, int64_t n_split, int64_t n,
                 double max_norm, double epsilon) override {
    if (!hit(d, "step_gate")) return;
    cpu::step_gate(out, losses, accum, pre, n_pre, sums, n_split, n, max_norm, epsilon);
  }

  void matmul(Device d, float* out, const float* a, const float* b, int64_t batch, int64_t M,
              int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t stride_a,
              int64_t stride_b) override {
    if (!hit(d, "matmul")) return;
    for (int64_t i = 0; i < batch; ++i)
      cpu::matmul(out + i * M * N, a + i * stride_a, b + i * stride_b, M, N, K, trans_a, trans_b,
                  1.0f, 0.0f);
  }
  void matmul_half(Device d, void* out, DType out_type, const void* a, const void* b, DType half,
                   const float* bias, int64_t batch, int64_t M, int64_t N, int64_t K, bool trans_a,
                   bool trans_b, int64_t stride_a, int64_t stride_b, const float* residual,
                   float alpha) override {
    if (!hit(d, "matmul_half")) return;
    EXPECT_TRUE(residual == nullptr || (out_type == DType::f32 && batch == 1));
    EXPECT_TRUE(half == DType::bf16 || half == DType::f16) << dtype_name(half);
    EXPECT_TRUE(out_type == DType::f32 || out_type == half) << dtype_name(out_type);
    // Widened exactly, then the CPU path's own kernels: the products of autocast on the CPU;
    // a half output is the f32 product rounded once.
    const std::vector<float> af = widen(a, half, (batch - 1) * stride_a + M * K);
    const std::vector<float> bf = widen(b, half, (batch - 1) * stride_b + K * N);
    std::vector<float> rounded(out_type == DType::f32 ? 0 : static_cast<size_t>(batch * M * N));
    float* o = out_type == DType::f32 ? static_cast<float*>(out) : rounded.data();
    if (bias != nullptr) {
      EXPECT_TRUE(batch == 1 && !trans_a && trans_b) << "a bias comes with linear's shapes";
      EXPECT_EQ(alpha, 1.0f) << "no caller scales a product with a bias";
      cpu::linear_forward(o, af.data(), bf.data(), bias, M, K, N);
    } else {
      for (int64_t i = 0; i < batch; ++i)
        cpu::matmul(o + i * M * N, af.data() + i * stride_a, bf.data() + i * stride_b, M, N, K,
                    trans_a, trans_b, alpha, 0.0f);
    }
    if (out_type != DType::f32) convert(o, DType::f32, out, out_type, rounded.size());
    // The CPU's residual + linear: the product first, then the sum.
    if (residual != nullptr) cpu::add(o, residual, o, M * N);
  }
  void bias_grad(Device d, float* dbias, const void* dout, DType dout_type, int64_t N,
                 int64_t C) override {
    if (!hit(d, "bias_grad")) return;
    const std::vector<float> g = widen(dout, dout_type, N * C);
    cpu::sum_first_dim(dbias, g.data(), N, C, false);
  }
  void weight_grad_half(Device d, float* dweight, float* dbias, const void* dout, const void* inp,
                        DType half, int64_t BT, int64_t C_in, int64_t C_out, float alpha) override {
    if (!hit(d, "weight_grad_half")) return;
    EXPECT_TRUE(half == DType::bf16 || half == DType::f16) << dtype_name(half);
    EXPECT_TRUE(dbias == nullptr || alpha == 1.0f);
    const std::vector<float> g = widen(dout, half, BT * C_out);
    if (dweight != nullptr) {
      const std::vector<float> x = widen(inp, half, BT * C_in);
      cpu::matmul(dweight, g.data(), x.data(), C_out, C_in, BT, true, false, alpha, 0.0f);
    }
    if (dbias != nullptr) cpu::sum_first_dim(dbias, g.data(), BT, C_out, false);
  }
  void linear_gelu_half(Device d, void* out, void* pre, const void* inp, const void* weight,
                        const float* bias, DType half, int64_t BT, int64_t C_in,
                        int64_t C_out) override {
    if (!hit(d, "linear_gelu_half")) return;
    // The CPU's gelu_mlp: the f32 sum, its rounded copy, GELU of the sum rounded.
    const std::vector<float> x = widen(inp, half, BT * C_in), w = widen(weight, half, C_out * C_in);
    std::vector<float> sum(static_cast<size_t>(BT * C_out)), y(sum.size());
    cpu::linear_forward(sum.data(), x.data(), w.data(), bias, BT, C_in, C_out);
    convert(sum.data(), DType::f32, pre, half, sum.size());
    cpu::gelu_forward(y.data(), sum.data(), BT * C_out);
    convert(y.data(), DType::f32, out, half, y.size());
  }
  void linear_input_grad_dgelu_half(Device d, void* dpre, float* dbias, const void* dout,
                                    const void* weight, const void* pre, DType half, int64_t BT,
                                    int64_t C_in, int64_t C_out) override {
    if (!hit(d, "linear_input_grad_dgelu_half")) return;
    const std::vector<float> g = widen(dout, half, BT * C_out),
                             w = widen(weight, half, C_out * C_in), p = widen(pre, half, BT * C_in);
    std::vector<float> dh(static_cast<size_t>(BT * C_in)), dp(dh.size());
    cpu::matmul(dh.data(), g.data(), w.data(), BT, C_in, C_out, false, false, 1.0f, 0.0f);
    cpu::gelu_backward(dp.data(), p.data(), dh.data(), BT * C_in);
    convert(dp.data(), DType::f32, dpre, half, dp.size());
    if (dbias != nullptr) {
      const std::vector<float> r = widen(dpre, half, BT * C_in);
      cpu::sum_first_dim(dbias, r.data(), BT, C_in, false);
    }
  }
  void linear_forward(Device d, float* out, const float* inp, const float* weight,
                      const float* bias, int64_t BT, int64_t C_in, int64_t C_out,
                      const float* residual) override {
    if (!hit(d, "linear_forward")) return;
    cpu::linear_forward(out, inp, weight, bias, BT, C_in, C_out);
    if (residual != nullptr) cpu::add(out, residual, out, BT * C_out);
  }
  void linear_backward(Device d, float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int64_t BT, int64_t C_in,
                       int64_t C_out) override {
    if (!hit(d, "linear_backward")) return;
    if (dinp != nullptr) cpu::matmul(dinp, dout, weight, BT, C_in, C_out, false, false, 1.0f, 0.0f);
    if (dweight != nullptr)
      cpu::matmul(dweight, dout, inp, C_out, C_in, BT, true, false, 1.0f, 0.0f);
    if (dbias != nullptr) cpu::sum_first_dim(dbias, dout, BT, C_out, false);
  }
  void layer_norm_forward(Device d, void* out, DType out_type, float* mean, float* rstd,
                          const float* inp, const float* weight, const float* bias, int64_t N,
                          int64_t C, float eps) override {
    if (!hit(d, "layer_norm_forward")) return;
    if (out_type == DType::f32) {
      cpu::layer_norm_forward(static_cast<float*>(out), mean, rstd, inp, weight, bias, N, C, eps);
      return;
    }
    std::vector<float> y(static_cast<size_t>(N * C));
    cpu::layer_norm_forward(y.data(), mean, rstd, inp, weight, bias, N, C, eps);
    convert(y.data(), DType::f32, out, out_type, y.size());
  }
  void layer_norm_backward(Device d, float* dinp, float* dweight, float* dbias, const void* dout,
                           DType dout_type, const float* inp, const float* weight,
                           const float* mean, const float* rstd, int64_t N, int64_t C,
                           bool accumulate_dinp, void* dinp_half, DType half) override {
    if (!hit(d, "layer_norm_backward")) return;
    const std::vector<float> g = widen(dout, dout_type, N * C);
    // Written: the CPU's kernel adds to what it is given.
    if (dweight != nullptr) std::fill(dweight, dweight + C, 0.0f);
    if (dbias != nullptr) std::fill(dbias, dbias + C, 0.0f);
    cpu::layer_norm_backward(dinp, dweight, dbias, g.data(), inp, weight, mean, rstd, N, C,
                             accumulate_dinp);
    EXPECT_TRUE(dinp_half == nullptr || dinp != nullptr);
    if (dinp_half != nullptr)
      convert(dinp, DType::f32, dinp_half, half, static_cast<size_t>(N * C));
  }
  void gelu_forward(Device d, void* out, DType out_type, const void* inp, DType inp_type,
                    int64_t n) override {
    if (!hit(d, "gelu_forward")) return;
    const std::vector<float> x = widen(inp, inp_type, n);
    std::vector<float> y(static_cast<size_t>(n));
    cpu::gelu_forward(y.data(), x.data(), n);
    convert(y.data(), DType::f32, out, out_type, y.size());
  }
  void gelu_forward_half(Device d, void* out, DType out_type, void* inp_half, const float* inp,
                         DType half, int64_t n) override {
    if (!hit(d, "gelu_forward_half")) return;
    EXPECT_TRUE(out_type == DType::f32 || out_type == half) << dtype_name(out_type);
    convert(inp, DType::f32, inp_half, half, static_cast<size_t>(n));
    const std::vector<float> x = widen(inp_half, half, n);
    std::vector<float> y(static_cast<size_t>(n));
    cpu::gelu_forward(y.data(), x.data(), n);
    convert(y.data(), DType::f32, out, out_type, y.size());
  }
  void gelu_backward(Device d, void* dinp, DType dinp_type, const void* inp, DType inp_type,
                     const void* dout, DType dout_type, int64_t n) override {
    if (!hit(d, "gelu_backward")) return;
    const std::vector<float> x = widen(inp, inp_type, n), g = widen(dout, dout_type, n);
    std::vector<float> dx(static_cast<size_t>(n));
    cpu::gelu_backward(dx.data(), x.data(), g.data(), n);
    convert(dx.data(), DType::f32, dinp, dinp_type, dx.size());
  }
  void dropout(Device d, float* out, const float* inp, int64_t n, float p, uint64_t seed,
               uint64_t offset) override {
    if (!hit(d, "dropout")) return;
    cpu::dropout_forward(out, inp, n, p, seed, offset);
  }
  void vocab_lookup_forward(Device d, float* out, const int32_t* idx, const float* table, int64_t N,
                            int64_t C, int64_t begin, int64_t valid) override {
    if (!hit(d, "vocab_lookup_forward")) return;
    cpu::vocab_lookup_forward(out, idx, table, N, C, begin, valid);
  }
  void vocab_lookup_backward(Device d, float* dtable, const float* dout, const int32_t* idx,
                             int64_t N, int64_t C, int64_t begin, int64_t valid) override {
    if (!hit(d, "vocab_lookup_backward")) return;
    cpu::vocab_lookup_backward(dtable, dout, idx, N, C, begin, valid);
  }
  void vocab_parallel_row_max(Device d, float* max, const float* logits, int64_t N, int64_t V,
                              int64_t valid) override {
    if (!hit(d, "vocab_parallel_row_max")) return;
    cpu::vocab_parallel_row_max(max, logits, N, V, valid);
  }
  void vocab_parallel_row_sums(Device d, float* sum, float* target_logit, const float* logits,
                               const float* max, const int32_t* targets, int64_t N, int64_t V,
                               int64_t valid, int64_t begin, int32_t ignore_index) override {
    if (!hit(d, "vocab_parallel_row_sums")) return;
    cpu::vocab_parallel_row_sums(sum, target_logit, logits, max, targets, N, V, valid, begin,
                                 ignore_index);
  }
  void vocab_parallel_backward(Device d, float* dlogits, const float* logits, const float* max,
                               const float* sum, const int32_t* targets, int64_t N, int64_t V,
                               int64_t valid, int64_t begin, int32_t ignore_index,
                               const float* dloss, const float* count) override {
    if (!hit(d, "vocab_parallel_backward")) return;
    cpu::vocab_parallel_backward(dlogits, logits, max, sum, targets, N, V, valid, begin,
                                 ignore_index, *dloss / *count);
  }
  void vocab_parallel_loss_mean(Device d, float* out, const float* max, const float* sum,
                                const float* target_logit, const int32_t* targets, int64_t N,
                                int32_t ignore_index) override {
    if (!hit(d, "vocab_parallel_loss_mean")) return;
    cpu::vocab_parallel_loss_mean(out, max, sum, target_logit, targets, N, ignore_index);
  }
  void gather_rows(Device d, float* out, const float* src, const int32_t* rows, int64_t n,
                   int64_t C) override {
    if (!hit(d, "gather_rows")) return;
    cpu::gather_rows(out, src, rows, n, C);
  }
  void scatter_add_rows(Device d, float* out, const float* src, const int32_t* rows,
                        const float* weights, int64_t n, int64_t C) override {
    if (!hit(d, "scatter_add_rows")) return;
    cpu::scatter_add_rows(out, src, rows, weights, n, C);
  }
  void weighted_rows_backward(Device d, float* dsrc, float* dweights, const float* dout,
                              const float* src, const float* weights, const int32_t* rows,
                              int64_t n, int64_t C) override {
    if (!hit(d, "weighted_rows_backward")) return;
    cpu::weighted_rows_backward(dsrc, dweights, dout, src, weights, rows, n, C);
  }
  void attention_forward(Device d, float* out, float* att, const float* qkv, int64_t B, int64_t T,
                         int64_t C, int64_t NH) override {
    hit(d, "attention_forward");
    cpu::attention_forward(out, att, qkv, B, T, C, NH);
  }
  void attention_backward(Device d, float* dqkv, float* scratch, const float* dout,
                          const float* qkv, const float* att, int64_t B, int64_t T, int64_t C,
                          int64_t NH) override {
    hit(d, "attention_backward");
    cpu::attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH);
  }
  // Flash attention played by the CPU's attention on the widened bf16 q, k, v (the probabilities
  // recomputed in the backward), so that a model on the fake device keeps the CPU's bits; the
  // head sizes are the cuda kernels'.
  bool flash_attention_supported(Device d, int64_t head_size) override {
    hit(d, "flash_attention_supported");
    return flash_attention_head_size(head_size);
  }
  void flash_attention_forward(Device d, void* out, DType out_type, float* lse,
                               const void* qkv_half, DType half, int64_t B, int64_t T, int64_t C,
                               int64_t NH) override {
    if (!hit(d, "flash_attention_forward")) return;
    EXPECT_TRUE(out_type == DType::f32 || out_type == half) << dtype_name(out_type);
    const std::vector<float> qkv = widen(qkv_half, half, B * T * 3 * C);
    std::vector<float> o(static_cast<size_t>(B * T * C)), att(static_cast<size_t>(B * NH * T * T));
    cpu::attention_forward(o.data(), att.data(), qkv.data(), B, T, C, NH);
    convert(o.data(), DType::f32, out, out_type, o.size());
    attention_lse_reference(lse, qkv.data(), B, T, C, NH);
  }
  void flash_attention_backward(Device d, void* dqkv, DType dqkv_type, float* scratch,
                                const void* dout, const void* qkv_half, DType half, const void* out,
                                DType out_type, const float* lse, int64_t B, int64_t T, int64_t C,
                                int64_t NH) override {
    if (!hit(d, "flash_attention_backward")) return;
    (void)scratch;
    (void)lse;
    EXPECT_TRUE(dqkv_type == DType::f32 || dqkv_type == half) << dtype_name(dqkv_type);
    const std::vector<float> qkv = widen(qkv_half, half, B * T * 3 * C);
    std::vector<float> o(static_cast<size_t>(B * T * C)), att(static_cast<size_t>(B * NH * T * T)),
        scr(att.size());
    cpu::attention_forward(o.data(), att.data(), qkv.data(), B, T, C, NH);
    // The output kept is the forward's, as rounded then.
    std::vector<float> want = o;
    if (out_type != DType::f32) {
      std::vector<uint16_t> bits(o.size());
      convert(o.data(), DType::f32, bits.data(), out_type, o.size());
      convert(bits.data(), out_type, want.data(), DType::f32, o.size());
    }
    EXPECT_TRUE(widen(out, out_type, B * T * C) == want) << "out is the forward's";
    const std::vector<float> g = widen(dout, out_type, B * T * C);
    std::vector<float> dx(qkv.size());
    cpu::attention_backward(dx.data(), scr.data(), g.data(), qkv.data(), att.data(), B, T, C, NH);
    convert(dx.data(), DType::f32, dqkv, dqkv_type, dx.size());
  }
  // Half logits widened, the CPU's kernel, the gradient rounded back: the device's arithmetic.
  void cross_entropy_forward(Device d, float* losses, float* lse, float* mean_loss,
                             const void* logits, DType logits_type, const int32_t* targets,
                             int64_t N, int64_t V, int32_t ignore_index, void* dlogits,
                             float label_smoothing) override {
    if (!hit(d, "cross_entropy_forward")) return;
    std::vector<float> x = widen(logits, logits_type, N * V);
    *mean_loss = cpu::cross_entropy_forward(losses, lse, x.data(), targets, N, V, ignore_index,
                                            label_smoothing);
    if (dlogits == nullptr) return;
    cpu::cross_entropy_backward(x.data(), x.data(), lse, targets, 1.0f, N, V, ignore_index,
                                label_smoothing);
    convert(x.data(), DType::f32, dlogits, logits_type, x.size());
  }
  void cross_entropy_backward(Device d, void* dlogits, const void* logits, DType logits_type,
                              const float* lse, const int32_t* targets, const float* dloss,
                              int64_t N, int64_t V, int32_t ignore_index,
                              float label_smoothing) override {
    if (!hit(d, "cross_entropy_backward")) return;
    std::vector<float> x = widen(logits, logits_type, N * V);
    cpu::cross_entropy_backward(x.data(), x.data(), lse, targets, *dloss, N, V, ignore_index,
                                label_smoothing);
    convert(x.data(), DType::f32, dlogits, logits_type, x.size());
  }
  void gpt_embedding_forward(Device d, float* out, const int32_t* idx, const float* wte,
                             const float* wpe, int64_t B, int64_t T, int64_t C,
                             int64_t V) override {
    if (!hit(d, "gpt_embedding_forward")) return;
    cpu::gpt_embedding_forward(out, idx, wte, wpe, B, T, C, V);
  }
  void gpt_embedding_backward(Device d, float* dwte, float* dwpe, const float* dout,
                              const int32_t* idx, int64_t B, int64_t T, int64_t C,
                              int64_t V) override {
    if (!hit(d, "gpt_embedding_backward")) return;
    // The device's sums: each token's from zero, then added to what the table holds.
    std::vector<float> e(dwte != nullptr ? static_cast<size_t>(V * C) : 0, 0.0f);
    cpu::gpt_embedding_backward(dwte != nullptr ? e.data() : nullptr, dwpe, dout, idx, B, T, C, V);
    for (size_t i = 0; i < e.size(); ++i) dwte[i] += e[i];
  }
  void adamw_step(Device d, float* param, const float* grad, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t t) override {
    hit(d, "adamw_step");
    cpu::adamw_step(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
  }
  void conv2d_forward(Device d, float* out, const float* inp, const float* weight,
                      const float* bias, const cpu::Conv2dShape& s) override {
    hit(d, "conv2d_forward");
    cpu::conv2d_forward(out, inp, weight, bias, s, cpu::conv_impl());
  }
  void conv2d_backward_data(Device d, float* dinp, const float* dout, const float* weight,
                            const cpu::Conv2dShape& s) override {
    hit(d, "conv2d_backward_data");
    cpu::conv2d_backward_data(dinp, dout, weight, s, cpu::conv_impl());
  }
  void conv2d_backward_weights(Device d, float* dweight, float* dbias, const float* dout,
                               const float* inp, const cpu::Conv2dShape& s) override {
    hit(d, "conv2d_backward_weights");
    cpu::conv2d_backward_weights(dweight, dbias, dout, inp, s, cpu::conv_impl());
  }
  void batch_norm_statistics(Device d, double* sums, const float* inp, int64_t N, int64_t C,
                             int64_t HW) override {
    hit(d, "batch_norm_statistics");
    cpu::batch_norm_statistics(sums, inp, N, C, HW);
  }
  void batch_norm_apply(Device d, float* out, const float* inp, const float* mean,
                        const float* invstd, const float* weight, const float* bias, int64_t N,
                        int64_t C, int64_t HW) override {
    hit(d, "batch_norm_apply");
    cpu::batch_norm_apply(out, inp, mean, invstd, weight, bias, N, C, HW);
  }
  void batch_norm_backward_reduce(Device d, double* sums, const float* dout, const float* inp,
                                  const float* mean, const float* invstd, int64_t N, int64_t C,
                                  int64_t HW) override {
    hit(d, "batch_norm_backward_reduce");
    cpu::batch_norm_backward_reduce(sums, dout, inp, mean, invstd, N, C, HW);
  }
  void batch_norm_backward_apply(Device d, float* dinp, const float* dout, const float* inp,
                                 const float* mean, const float* invstd, const float* weight,
                                 const double* sums, int64_t count, int64_t N, int64_t C,
                                 int64_t HW) override {
    hit(d, "batch_norm_backward_apply");
    cpu::batch_norm_backward_apply(dinp, dout, inp, mean, invstd, weight, sums, count, N, C, HW);
  }
  void max_pool2d_forward(Device d, float* out, int32_t* argmax, const float* inp,
                          const cpu::Pool2dShape& s) override {
    hit(d, "max_pool2d_forward");
    cpu::max_pool2d_forward(out, argmax, inp, s);
  }
  void max_pool2d_backward(Device d, float* dinp, const float* dout, const int32_t* argmax,
                           const cpu::Pool2dShape& s) override {
    hit(d, "max_pool2d_backward");
    cpu::max_pool2d_backward(dinp, dout, argmax, s);
  }
  void avg_pool2d_forward(Device d, float* out, const float* inp, const cpu::Pool2dShape& s,
                          bool count_include_pad) override {
    hit(d, "avg_pool2d_forward");
    cpu::avg_pool2d_forward(out, inp, s, count_include_pad);
  }
  void avg_pool2d_backward(Device d, float* dinp, const float* dout, const cpu::Pool2dShape& s,
                           bool count_include_pad) override {
    hit(d, "avg_pool2d_backward");
    cpu::avg_pool2d_backward(dinp, dout, s, count_include_pad);
  }
  void global_avg_pool_forward(Device d, float* out, const float* inp, int64_t N, int64_t C,
                               int64_t HW) override {
    hit(d, "global_avg_pool_forward");
    cpu::global_avg_pool_forward(out, inp, N, C, HW);
  }
  void global_avg_pool_backward(Device d, float* dinp, const float* dout, int64_t N, int64_t C,
                                int64_t HW) override {
    hit(d, "global_avg_pool_backward");
    cpu::global_avg_pool_backward(dinp, dout, N, C, HW);
  }
  void relu_forward(Device d, float* out, const float* inp, int64_t n) override {
    hit(d, "relu_forward");
    cpu::relu_forward(out, inp, n);
  }
  void relu_backward(Device d, float* dinp, const float* dout, const float* out,
                     int64_t n) override {
    hit(d, "relu_backward");
    cpu::relu_backward(dinp, dout, out, n);
  }

  void sgd_step(Device d, float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) override {
    hit(d, "sgd_step");
    cpu::sgd_step(param, grad, momentum_buf, n, lr, momentum, dampening, weight_decay, nesterov,
                  first_step);
  }

  void adamw_step_many(Device d, float* const* params, const float* const* grads, float* const* m,
                       float* const* v, const int64_t* ns, const float* decays, int64_t count,
                       float lr, float beta1, float beta2, float eps, int64_t t, float grad_scale,
                       const cpu::StepGate* gate) override {
    if (!hit(d, "adamw_step_many")) return;
    if (gate != nullptr) {
      if (gate->skip) return;
      grad_scale = gate->coef;
    }
    for (int64_t i = 0; i < count; ++i)
      cpu::adamw_step(params[i], grads[i], m[i], v[i], ns[i], lr, beta1, beta2, eps, decays[i], t,
                      grad_scale);
  }

 private:
  // n elements of `type` (f32, bf16 or f16) widened exactly to f32.
  static std::vector<float> widen(const void* p, DType type, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    convert(p, type, v.data(), DType::f32, static_cast<size_t>(n));
    return v;
  }
  // Counts the call; false when the kernel should not compute (see `compute`).
  bool hit(Device d, const char* op) {
    EXPECT_EQ(d.type, DeviceType::cuda) << op;
    std::lock_guard lock(mu_);
    ++calls[op];
    return compute;
  }
  std::mutex mu_;
};

// Installs both fakes for DeviceType::cuda for the duration of each test.
class FakeDeviceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    set_allocator(DeviceType::cuda, &alloc_);
    set_device_kernels(DeviceType::cuda, &kernels_);
  }
  void TearDown() override {
    set_device_kernels(DeviceType::cuda, nullptr);
    set_allocator(DeviceType::cuda, nullptr);
  }
  FakeDeviceAllocator alloc_;
  FakeDeviceKernels kernels_;
};

}  // namespace meshtrain::test
