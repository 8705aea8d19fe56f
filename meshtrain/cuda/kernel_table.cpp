// The tensor core's kernel table for cuda tensors: each entry queues the matching CUDA kernel on
// the current stream of the tensor's device. The process's current device must be that device
// (one device per process, set once at start-up by use_device); kernels are not guarded per call.
//
// Attention runs on cuBLASLt (attention_gemm.h) unless MESHTRAIN_CUDA_ATTENTION=simple selects
// the simple kernels of attention.h, the reference the GEMM version is tested against.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/kernels/adamw.h"
#include "meshtrain/cuda/kernels/attention.h"
#include "meshtrain/cuda/kernels/attention_gemm.h"
#include "meshtrain/cuda/kernels/cast.h"
#include "meshtrain/cuda/kernels/conv2d.h"
#include "meshtrain/cuda/kernels/cross_entropy.h"
#include "meshtrain/cuda/kernels/dropout.h"
#include "meshtrain/cuda/kernels/elementwise.h"
#include "meshtrain/cuda/kernels/embedding.h"
#include "meshtrain/cuda/kernels/flash_attention.h"
#include "meshtrain/cuda/kernels/gelu.h"
#include "meshtrain/cuda/kernels/gemm.h"
#include "meshtrain/cuda/kernels/index_rows.h"
#include "meshtrain/cuda/kernels/layer_norm.h"
#include "meshtrain/cuda/kernels/sgd.h"
#include "meshtrain/cuda/kernels/step_gate.h"
#include "meshtrain/cuda/kernels/sum_squares.h"
#include "meshtrain/cuda/kernels/vision.h"
#include "meshtrain/cuda/kernels/vocab_parallel_cross_entropy.h"
#include "meshtrain/util/env_registry.h"

namespace meshtrain::cuda {
namespace {

// MESHTRAIN_CUDA_ATTENTION: flash (the default: flash attention under bf16 or f16 autocast, the
// GEMM version otherwise), gemm (never flash) or simple.
enum class AttentionChoice { flash, gemm, simple };

AttentionChoice attention_choice() {
  static const AttentionChoice choice = [] {
    const auto v = env_value(Env::cuda_attention);
    if (!v || *v == "flash") return AttentionChoice::flash;
    if (*v == "gemm") return AttentionChoice::gemm;
    MT_CHECK(*v == "simple", "MESHTRAIN_CUDA_ATTENTION=", *v,
             " is not an attention implementation (expected flash, gemm or simple)");
    return AttentionChoice::simple;
  }();
  return choice;
}

bool simple_attention() {
  return attention_choice() == AttentionChoice::simple;
}

// Host values a kernel reads (a few per channel): copied to device scratch on the stream. The
// copy from pageable memory is staged before the call returns, so the host array may go.
void upload(float* dst, const float* src, int64_t n, cudaStream_t stream) {
  if (n > 0)
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(float),
                                  cudaMemcpyHostToDevice, stream));
}

// Device results the host combines (per-channel sums): copied back, waiting for the stream.
void download_and_wait(double* dst, const double* src, int64_t n, cudaStream_t stream) {
  if (n > 0)
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(n) * sizeof(double),
                                  cudaMemcpyDeviceToHost, stream));
  MT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

class CudaKernels final : public DeviceKernels {
 public:
  void add(Device d, float* out, const float* a, const float* b, int64_t n) override {
    cuda::add(out, a, b, n, s(d));
  }
  void add_rows(Device d, float* out, const float* a, const float* row, int64_t n,
                int64_t width) override {
    cuda::add_rows(out, a, row, n, width, s(d));
  }
  void sum_dim(Device d, float* out, const float* inp, int64_t outer, int64_t mid,
               int64_t inner) override {
    cuda::sum_dim(out, inp, outer, mid, inner, s(d));
  }
  void mul(Device d, float* out, const float* a, const float* b, int64_t n) override {
    cuda::mul(out, a, b, n, s(d));
  }
  void scale(Device d, float* out, const float* a, float f, int64_t n) override {
    cuda::scale(out, a, f, n, s(d));
  }
  void scale_many(Device d, float* const* xs, const int64_t* ns, int64_t count, float f) override {
    cuda::scale_many(xs, ns, count, f, s(d));
  }
  void axpy(Device d, float* y, const float* x, float alpha, int64_t n) override {
    cuda::axpy(y, x, alpha, n, s(d));
  }
  void cast(Device d, void* dst, DType dst_type, const void* src, DType src_type,
            int64_t n) override {
    cuda::cast(dst, dst_type, src, src_type, n, s(d));
  }
  double sum_squares(Device d, const float* x, int64_t n) override {
    if (n <= 0) return 0.0;
    const cudaStream_t st = s(d);
    StreamScratch scratch(d.index, (kSumSquaresScratch + 1) * sizeof(double), st);
    double* out = scratch.as<double>() + kSumSquaresScratch;
    cuda::sum_squares(out, scratch.as<double>(), x, n, st);
    double host = 0.0;
    download_and_wait(&host, out, 1, st);
    return host;
  }
  void sum_squares_each(Device d, const float* const* xs, const int64_t* ns, int64_t count,
                        double* out) override {
    if (count <= 0) return;
    const cudaStream_t st = s(d);
    // The partial sums of every array, then the results.
    StreamScratch scratch(
        d.index, static_cast<size_t>(count) * (kSumSquaresScratch + 1) * sizeof(double), st);
    double* sums = scratch.as<double>() + count * kSumSquaresScratch;
    cuda::sum_squares_many(sums, scratch.as<double>(), xs, ns, count, st);
    download_and_wait(out, sums, count, st);
  }
  void sum_squares_each_on_device(Device d, const float* const* xs, const int64_t* ns,
                                  int64_t count, double* out) override {
    if (count <= 0) return;
    const cudaStream_t st = s(d);
    StreamScratch scratch(d.index, static_cast<size_t>(count) * kSumSquaresScratch * sizeof(double),
                          st);
    cuda::sum_squares_many(out, scratch.as<double>(), xs, ns, count, st);
  }
  void step_gate(Device d, cpu::StepGate* out, const float* losses, int64_t accum,
                 const double* pre, int64_t n_pre, const double* sums, int64_t n_split, int64_t n,
                 double max_norm, double epsilon) override {
    cuda::step_gate(out, losses, accum, pre, n_pre, sums, n_split, n, max_norm, epsilon, s(d));
  }

  void matmul(Device d, float* out, const float* a, const float* b, int64_t batch, int64_t M,
              int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t stride_a,
              int64_t stride_b) override {
    const GemmShape g = gemm_shape(M, N, K, trans_a, trans_b, batch, stride_a, stride_b);
    cuda::matmul(out, a, b, nullptr, DType::f32, g, 1.0f, 0.0f, s(d));
  }

  void matmul_half(Device d, void* out, DType out_type, const void* a, const void* b, DType half,
                   const float* bias, int64_t batch, int64_t M, int64_t N, int64_t K, bool trans_a,
                   bool trans_b, int64_t stride_a, int64_t stride_b, const float* residual,
                   float alpha) override {
    MT_CHECK(half == DType::bf16 || half == DType::f16, "matmul_half: ", dtype_name(half),
             " is not a half type");
    MT_CHECK(out_type == DType::f32 || out_type == half, "matmul_half: the output is f32 or ",
             dtype_name(half), "; got ", dtype_name(out_type));
    MT_CHECK(residual == nullptr || (out_type == DType::f32 && batch == 1),
             "matmul_half: a residual joins one product with an f32 output");
    // A half output's f32 bias may need the way round through an f32 product, which takes one.
    MT_CHECK(bias == nullptr || batch == 1 || out_type == DType::f32,
             "matmul_half: a bias on a batched product with a half output is not supported");
    GemmShape g = gemm_shape(M, N, K, trans_a, trans_b, batch, stride_a, stride_b);
    g.f32_out = out_type == DType::f32;
    g.f32_bias = true;  // the f32 master bias, whatever the output
    // The residual is cuBLASLt's C (beta = 1), the output its D: one pass over the output.
    cuda::matmul(out, a, b, bias, half, g, alpha, residual != nullptr ? 1.0f : 0.0f, s(d),
                 residual);
  }

  void weight_grad_half(Device d, float* dweight, float* dbias, const void* dout, const void* inp,
                        DType half, int64_t BT, int64_t C_in, int64_t C_out, float alpha) override {
    MT_CHECK(half == DType::bf16 || half == DType::f16, "weight_grad_half: ", dtype_name(half),
             " is not a half type");
    MT_CHECK(dbias == nullptr || alpha == 1.0f,
             "weight_grad_half: a bias gradient comes with alpha 1 only, got ", alpha);
    if (dweight == nullptr) {
      if (dbias != nullptr) bias_grad(d, dbias, dout, half, BT, C_out);
      return;
    }
    // dweight[C_out, C_in] = dout^T[C_out, BT] @ inp[BT, C_in]
    GemmShape g = gemm_shape(C_out, C_in, BT, true);
    g.f32_out = true;
    if (dbias == nullptr)
      cuda::matmul(dweight, dout, inp, nullptr, half, g, alpha, 0.0f, s(d));
    else
      cuda::matmul_bias_grad(dweight, dbias, dout, inp, half, g, s(d));
  }

  void linear_gelu_half(Device d, void* out, void* pre, const void* inp, const void* weight,
                        const float* bias, DType half, int64_t BT, int64_t C_in,
                        int64_t C_out) override {
    // out[BT, C_out] = gelu(inp[BT, C_in] @ weight[C_out, C_in]^T + bias)
    cuda::matmul_gelu(out, pre, inp, weight, bias, half, gemm_shape(BT, C_out, C_in, false, true),
                      s(d));
  }
  void linear_input_grad_dgelu_half(Device d, void* dpre, float* dbias, const void* dout,
                                    const void* weight, const void* pre, DType half, int64_t BT,
                                    int64_t C_in, int64_t C_out) override {
    // dpre[BT, C_in] = gelu'(pre) * (dout[BT, C_out] @ weight[C_out, C_in])
    cuda::matmul_dgelu(dpre, dbias, dout, weight, pre, half, gemm_shape(BT, C_in, C_out), s(d));
  }

  void linear_forward(Device d, float* out, const float* inp, const float* weight,
                      const float* bias, int64_t BT, int64_t C_in, int64_t C_out,
                      const float* residual) override {
    cuda::linear_forward(out, inp, weight, bias, DType::f32, BT, C_in, C_out, s(d), residual);
  }
  void linear_backward(Device d, float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int64_t BT, int64_t C_in,
                       int64_t C_out) override {
    const cudaStream_t st = s(d);
    // beta = 0 products write the fresh buffers.
    if (dinp != nullptr) {
      // dinp[BT, C_in] = dout[BT, C_out] @ weight[C_out, C_in]
      cuda::matmul(dinp, dout, weight, nullptr, DType::f32, gemm_shape(BT, C_in, C_out), 1.0f, 0.0f,
                   st);
    }
    if (dweight != nullptr) {
      // dweight[C_out, C_in] = dout^T[C_out, BT] @ inp[BT, C_in], with dbias from the same reads.
      cuda::matmul_bias_grad(dweight, dbias, dout, inp, DType::f32,
                             gemm_shape(C_out, C_in, BT, true), st);
    } else if (dbias != nullptr) {
      bias_grad(d, dbias, dout, DType::f32, BT, C_out);
    }
  }

  void bias_grad(Device d, float* dbias, const void* dout, DType dout_type, int64_t N,
                 int64_t C) override {
    column_sums(dbias, dout, dout_type, N, C, s(d));
  }

  void layer_norm_forward(Device d, void* out, DType out_type, float* mean, float* rstd,
                          const float* inp, const float* weight, const float* bias, int64_t N,
                          int64_t C, float eps) override {
    cuda::layer_norm_forward(out, out_type, mean, rstd, inp, weight, bias, N, C, eps, s(d));
  }
  void layer_norm_backward(Device d, float* dinp, float* dweight, float* dbias, const void* dout,
                           DType dout_type, const float* inp, const float* weight,
                           const float* mean, const float* rstd, int64_t N, int64_t C,
                           bool accumulate_dinp, void* dinp_half, DType half) override {
    cuda::layer_norm_backward(dinp, dweight, dbias, dout, dout_type, inp, weight, mean, rstd, N, C,
                              s(d), accumulate_dinp, dinp_half, half);
  }

  void gelu_forward(Device d, void* out, DType out_type, const void* inp, DType inp_type,
                    int64_t n) override {
    cuda::gelu_forward(out, out_type, inp, inp_type, n, s(d));
  }
  void gelu_forward_half(Device d, void* out, DType out_type, void* inp_half, const float* inp,
                         DType half, int64_t n) override {
    cuda::gelu_forward_half(out, out_type, inp_half, inp, half, n, s(d));
  }
  void gelu_backward(Device d, void* dinp, DType dinp_type, const void* inp, DType inp_type,
                     const void* dout, DType dout_type, int64_t n) override {
    cuda::gelu_backward(dinp, dinp_type, inp, inp_type, dout, dout_type, n, s(d));
  }
  void dropout(Device d, float* out, const float* inp, int64_t n, float p, uint64_t seed,
               uint64_t offset) override {
    cuda::dropout(out, inp, n, p, seed, offset, s(d));
  }
  void vocab_lookup_forward(Device d, float* out, const int32_t* idx, const float* table, int64_t N,
                            int64_t C, int64_t begin, int64_t valid) override {
    cuda::vocab_lookup_forward(out, idx, table, N, C, begin, valid, s(d));
  }
  void vocab_lookup_backward(Device d, float* dtable, const float* dout, const int32_t* idx,
                             int64_t N, int64_t C, int64_t begin, int64_t valid) override {
    cuda::vocab_lookup_backward(dtable, dout, idx, N, C, begin, valid, s(d));
  }
  void vocab_parallel_row_max(Device d, float* max, const float* logits, int64_t N, int64_t V,
                              int64_t valid) override {
    cuda::vocab_parallel_row_max(max, logits, N, V, valid, s(d));
  }
  void vocab_parallel_row_sums(Device d, float* sum, float* target_logit, const float* logits,
                               const float* max, const int32_t* targets, int64_t N, int64_t V,
                               int64_t valid, int64_t begin, int32_t ignore_index) override {
    cuda::vocab_parallel_row_sums(sum, target_logit, logits, max, targets, N, V, valid, begin,
                                  ignore_index, s(d));
  }
  void vocab_parallel_backward(Device d, float* dlogits, const float* logits, const float* max,
                               const float* sum, const int32_t* targets, int64_t N, int64_t V,
                               int64_t valid, int64_t begin, int32_t ignore_index,
                               const float* dloss, const float* count) override {
    cuda::vocab_parallel_backward(dlogits, logits, max, sum, targets, N, V, valid, begin,
                                  ignore_index, dloss, count, s(d));
  }
  void vocab_parallel_loss_mean(Device d, float* out, const float* max, const float* sum,
                                const float* target_logit, const int32_t* targets, int64_t N,
                                int32_t ignore_index) override {
    cuda::vocab_parallel_loss_mean(out, max, sum, target_logit, targets, N, ignore_index, s(d));
  }
  void gather_rows(Device d, float* out, const float* src, const int32_t* rows, int64_t n,
                   int64_t C) override {
    cuda::gather_rows(out, src, rows, n, C, s(d));
  }
  void scatter_add_rows(Device d, float* out, const float* src, const int32_t* rows,
                        const float* weights, int64_t n, int64_t C) override {
    cuda::scatter_add_rows(out, src, rows, weights, n, C, s(d));
  }
  void weighted_rows_backward(Device d, float* dsrc, float* dweights, const float* dout,
                              const float* src, const float* weights, const int32_t* rows,
                              int64_t n, int64_t C) override {
    cuda::weighted_rows_backward(dsrc, dweights, dout, src, weights, rows, n, C, s(d));
  }

  void attention_forward(Device d, float* out, float* att, const float* qkv, int64_t B, int64_t T,
                         int64_t C, int64_t NH) override {
    if (simple_attention()) {
      cuda::attention_forward(out, att, qkv, B, T, C, NH, s(d));
    } else {
      attention_forward_gemm(out, att, qkv, B, T, C, NH, s(d));
    }
  }
  void attention_backward(Device d, float* dqkv, float* scratch, const float* dout,
                          const float* qkv, const float* att, int64_t B, int64_t T, int64_t C,
                          int64_t NH) override {
    if (simple_attention()) {
      cuda::attention_backward(dqkv, scratch, dout, qkv, att, B, T, C, NH, s(d));
    } else {
      attention_backward_gemm(dqkv, scratch, dout, qkv, att, B, T, C, NH, s(d));
    }
  }

  bool flash_attention_supported(Device, int64_t head_size) override {
    return attention_choice() == AttentionChoice::flash && flash_attention_supports(head_size);
  }
  void flash_attention_forward(Device d, void* out, DType out_type, float* lse, const void* qkv,
                               DType half, int64_t B, int64_t T, int64_t C, int64_t NH) override {
    // The faster of the forward's two layouts for the shape (the same bits either way).
    cuda::flash_attention_forward(out, out_type, lse, qkv, half, B, T, C, NH, s(d), 0);
  }
  void flash_attention_backward(Device d, void* dqkv, DType dqkv_type, float* scratch,
                                const void* dout, const void* qkv, DType half, const void* out,
                                DType out_type, const float* lse, int64_t B, int64_t T, int64_t C,
                                int64_t NH) override {
    cuda::flash_attention_backward(dqkv, dqkv_type, scratch, dout, qkv, half, out, out_type, lse, B,
                                   T, C, NH, s(d));
  }

  void cross_entropy_forward(Device d, float* losses, float* lse, float* mean_loss,
                             const void* logits, DType logits_type, const int32_t* targets,
                             int64_t N, int64_t V, int32_t ignore_index, void* dlogits,
                             float label_smoothing) override {
    const cudaStream_t st = s(d);
    StreamScratch scale(d.index, sizeof(float), st);
    cuda::cross_entropy_forward(losses, lse, mean_loss, logits, logits_type, targets, N, V,
                                ignore_index, st, dlogits, scale.as<float>(), label_smoothing);
  }
  void cross_entropy_backward(Device d, void* dlogits, const void* logits, DType logits_type,
                              const float* lse, const int32_t* targets, const float* dloss,
                              int64_t N, int64_t V, int32_t ignore_index,
                              float label_smoothing) override {
    const cudaStream_t st = s(d);
    StreamScratch scale(d.index, sizeof(float), st);
    cuda::cross_entropy_backward(dlogits, logits, logits_type, lse, targets, dloss,
                                 scale.as<float>(), N, V, ignore_index, st, label_smoothing);
  }

  void gpt_embedding_forward(Device d, float* out, const int32_t* idx, const float* wte,
                             const float* wpe, int64_t B, int64_t T, int64_t C,
                             int64_t V) override {
    cuda::gpt_embedding_forward(out, idx, wte, wpe, B, T, C, V, s(d));
  }
  void gpt_embedding_backward(Device d, float* dwte, float* dwpe, const float* dout,
                              const int32_t* idx, int64_t B, int64_t T, int64_t C,
                              int64_t V) override {
    cuda::gpt_embedding_backward(dwte, dwpe, dout, idx, B, T, C, V, s(d));
  }

  void conv2d_forward(Device d, float* out, const float* inp, const float* weight,
                      const float* bias, const cpu::Conv2dShape& sh) override {
    cuda::conv2d_forward(out, inp, weight, bias, sh, s(d));
  }
  void conv2d_backward_data(Device d, float* dinp, const float* dout, const float* weight,
                            const cpu::Conv2dShape& sh) override {
    cuda::conv2d_backward_data(dinp, dout, weight, sh, s(d));
  }
  void conv2d_backward_weights(Device d, float* dweight, float* dbias, const float* dout,
                               const float* inp, const cpu::Conv2dShape& sh) override {
    cuda::conv2d_backward_weights(dweight, dbias, dout, inp, sh, s(d));
  }

  void batch_norm_statistics(Device d, double* sums, const float* inp, int64_t N, int64_t C,
                             int64_t HW) override {
    const cudaStream_t st = s(d);
    StreamScratch dev(d.index, static_cast<size_t>(2 * C) * sizeof(double), st);
    cuda::batch_norm_statistics(dev.as<double>(), inp, N, C, HW, st);
    download_and_wait(sums, dev.as<double>(), 2 * C, st);
  }
  void batch_norm_apply(Device d, float* out, const float* inp, const float* mean,
                        const float* invstd, const float* weight, const float* bias, int64_t N,
                        int64_t C, int64_t HW) override {
    const cudaStream_t st = s(d);
    StreamScratch stats(d.index, static_cast<size_t>(2 * C) * sizeof(float), st);
    upload(stats.as<float>(), mean, C, st);
    upload(stats.as<float>() + C, invstd, C, st);
    cuda::batch_norm_apply(out, inp, stats.as<float>(), stats.as<float>() + C, weight, bias, N, C,
                           HW, st);
  }
  void batch_norm_backward_reduce(Device d, double* sums, const float* dout, const float* inp,
                                  const float* mean, const float* invstd, int64_t N, int64_t C,
                                  int64_t HW) override {
    const cudaStream_t st = s(d);
    StreamScratch stats(d.index, static_cast<size_t>(2 * C) * sizeof(float), st);
    upload(stats.as<float>(), mean, C, st);
    upload(stats.as<float>() + C, invstd, C, st);
    StreamScratch dev(d.index, static_cast<size_t>(2 * C) * sizeof(double), st);
    cuda::batch_norm_backward_reduce(dev.as<double>(), dout, inp, stats.as<float>(),
                                     stats.as<float>() + C, N, C, HW, st);
    download_and_wait(sums, dev.as<double>(), 2 * C, st);
  }
  void batch_norm_backward_apply(Device d, float* dinp, const float* dout, const float* inp,
                                 const float* mean, const float* invstd, const float* weight,
                                 const double* sums, int64_t count, int64_t N, int64_t C,
                                 int64_t HW) override {
    const cudaStream_t st = s(d);
    // mean, invstd and (training) the two terms the CPU forms from the total sums: 4C floats.
    std::vector<float> host(static_cast<size_t>(4 * C));
    std::copy(mean, mean + C, host.begin());
    std::copy(invstd, invstd + C, host.begin() + C);
    if (sums != nullptr) {
      const double n = static_cast<double>(count);
      for (int64_t c = 0; c < 2 * C; ++c)
        host[static_cast<size_t>(2 * C + c)] = static_cast<float>(sums[c] / n);
    }
    StreamScratch stats(d.index, host.size() * sizeof(float), st);
    upload(stats.as<float>(), host.data(), 4 * C, st);
    const float* f = stats.as<float>();
    cuda::batch_norm_backward_apply(dinp, dout, inp, f, f + C, weight,
                                    sums != nullptr ? f + 2 * C : nullptr, N, C, HW, st);
  }
  void max_pool2d_forward(Device d, float* out, int32_t* argmax, const float* inp,
                          const cpu::Pool2dShape& sh) override {
    cuda::max_pool2d_forward(out, argmax, inp, sh, s(d));
  }
  void max_pool2d_backward(Device d, float* dinp, const float* dout, const int32_t* argmax,
                           const cpu::Pool2dShape& sh) override {
    cuda::max_pool2d_backward(dinp, dout, argmax, sh, s(d));
  }
  void avg_pool2d_forward(Device d, float* out, const float* inp, const cpu::Pool2dShape& sh,
                          bool count_include_pad) override {
    cuda::avg_pool2d_forward(out, inp, sh, count_include_pad, s(d));
  }
  void avg_pool2d_backward(Device d, float* dinp, const float* dout, const cpu::Pool2dShape& sh,
                           bool count_include_pad) override {
    cuda::avg_pool2d_backward(dinp, dout, sh, count_include_pad, s(d));
  }
  void global_avg_pool_forward(Device d, float* out, const float* inp, int64_t N, int64_t C,
                               int64_t HW) override {
    cuda::global_avg_pool_forward(out, inp, N, C, HW, s(d));
  }
  void global_avg_pool_backward(Device d, float* dinp, const float* dout, int64_t N, int64_t C,
                                int64_t HW) override {
    cuda::global_avg_pool_backward(dinp, dout, N, C, HW, s(d));
  }
  void relu_forward(Device d, float* out, const float* inp, int64_t n) override {
    cuda::relu_forward(out, inp, n, s(d));
  }
  void relu_backward(Device d, float* dinp, const float* dout, const float* out,
                     int64_t n) override {
    cuda::relu_backward(dinp, dout, out, n, s(d));
  }

  void sgd_step(Device d, float* param, const float* grad, float* momentum_buf, int64_t n, float lr,
                float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) override {
    cuda::sgd_step(param, grad, momentum_buf, n, lr, momentum, dampening, weight_decay, nesterov,
                   first_step, s(d));
  }

  void adamw_step(Device d, float* param, const float* grad, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t t) override {
    cuda::adamw_step(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t, s(d));
  }
  void adamw_step_many(Device d, float* const* params, const float* const* grads, float* const* m,
                       float* const* v, const int64_t* ns, const float* decays, int64_t count,
                       float lr, float beta1, float beta2, float eps, int64_t t, float grad_scale,
                       const cpu::StepGate* gate) override {
    cuda::adamw_step_many(params, grads, m, v, ns, decays, count, lr, beta1, beta2, eps, t,
                          grad_scale, gate, s(d));
  }

 private:
  static cudaStream_t s(Device d) { return current_stream(d.index); }
};

}  // namespace

DeviceKernels* kernel_table() {
  static CudaKernels k;
  return &k;
}

}  // namespace meshtrain::cuda
