// Where a step's device time goes, op by op: a kernel table that forwards every call to another
// (the cuda one) and brackets it with two events on the device's current stream. Installed for a
// step with set_device_kernels(DeviceType::cuda, &profiler); report() then waits for the device
// and sums each op's event-to-event times. Work outside the table (the caching allocator's
// zero-fills, NCCL, host copies) is not counted: the step's time less the table's total says how
// much that is. The events cost a few microseconds per call, so profile one step, not all.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::cuda {

struct OpTime {
  std::string op;
  int calls = 0;
  double ms = 0;
};

class KernelProfiler final : public DeviceKernels {
 public:
  explicit KernelProfiler(DeviceKernels& inner) : inner_(inner) {}
  ~KernelProfiler() override;
  KernelProfiler(const KernelProfiler&) = delete;
  KernelProfiler& operator=(const KernelProfiler&) = delete;

  // Waits for the device; the ops by total time, largest first. Clears what was recorded.
  std::vector<OpTime> report();

  void add(Device device, float* out, const float* a, const float* b, int64_t n) override {
    const Span span(*this, "add", device);
    inner_.add(device, out, a, b, n);
  }
  void add_rows(Device device, float* out, const float* a, const float* row, int64_t n,
                int64_t width) override {
    const Span span(*this, "add_rows", device);
    inner_.add_rows(device, out, a, row, n, width);
  }
  void sum_dim(Device device, float* out, const float* inp, int64_t outer, int64_t mid,
               int64_t inner) override {
    const Span span(*this, "sum_dim", device);
    inner_.sum_dim(device, out, inp, outer, mid, inner);
  }
  void mul(Device device, float* out, const float* a, const float* b, int64_t n) override {
    const Span span(*this, "mul", device);
    inner_.mul(device, out, a, b, n);
  }
  void scale(Device device, float* out, const float* a, float s, int64_t n) override {
    const Span span(*this, "scale", device);
    inner_.scale(device, out, a, s, n);
  }
  void scale_many(Device device, float* const* xs, const int64_t* ns, int64_t count,
                  float s) override {
    const Span span(*this, "scale_many", device);
    inner_.scale_many(device, xs, ns, count, s);
  }
  void axpy(Device device, float* y, const float* x, float alpha, int64_t n) override {
    const Span span(*this, "axpy", device);
    inner_.axpy(device, y, x, alpha, n);
  }
  void cast(Device device, void* dst, DType dst_type, const void* src, DType src_type,
            int64_t n) override {
    const Span span(*this, "cast", device);
    inner_.cast(device, dst, dst_type, src, src_type, n);
  }
  double sum_squares(Device device, const float* x, int64_t n) override {
    const Span span(*this, "sum_squares", device);
    return inner_.sum_squares(device, x, n);
  }
  void sum_squares_each(Device device, const float* const* xs, const int64_t* ns, int64_t count,
                        double* out) override {
    const Span span(*this, "sum_squares_each", device);
    inner_.sum_squares_each(device, xs, ns, count, out);
  }
  void sum_squares_each_on_device(Device device, const float* const* xs, const int64_t* ns,
                                  int64_t count, double* out) override {
    const Span span(*this, "sum_squares_each", device);
    inner_.sum_squares_each_on_device(device, xs, ns, count, out);
  }
  void step_gate(Device device, cpu::StepGate* out, const float* losses, int64_t accum,
                 const double* pre, int64_t n_pre, const double* sums, int64_t n_split, int64_t n,
                 double max_norm, double epsilon) override {
    const Span span(*this, "step_gate", device);
    inner_.step_gate(device, out, losses, accum, pre, n_pre, sums, n_split, n, max_norm, epsilon);
  }
  void matmul(Device device, float* out, const float* a, const float* b, int64_t batch, int64_t M,
              int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t stride_a,
              int64_t stride_b) override {
    const Span span(*this, "matmul", device);
    inner_.matmul(device, out, a, b, batch, M, N, K, trans_a, trans_b, stride_a, stride_b);
  }
  void matmul_half(Device device, void* out, DType out_type, const void* a, const void* b,
                   DType half, const float* bias, int64_t batch, int64_t M, int64_t N, int64_t K,
                   bool trans_a, bool trans_b, int64_t stride_a, int64_t stride_b,
                   const float* residual, float alpha) override {
    const Span span(*this, "matmul_half", device);
    inner_.matmul_half(device, out, out_type, a, b, half, bias, batch, M, N, K, trans_a, trans_b,
                       stride_a, stride_b, residual, alpha);
  }
  void bias_grad(Device device, float* dbias, const void* dout, DType dout_type, int64_t N,
                 int64_t C) override {
    const Span span(*this, "bias_grad", device);
    inner_.bias_grad(device, dbias, dout, dout_type, N, C);
  }
  void weight_grad_half(Device device, float* dweight, float* dbias, const void* dout,
                        const void* inp, DType half, int64_t BT, int64_t C_in, int64_t C_out,
                        float alpha) override {
    const Span span(*this, "weight_grad_half", device);
    inner_.weight_grad_half(device, dweight, dbias, dout, inp, half, BT, C_in, C_out, alpha);
  }
  void linear_gelu_half(Device device, void* out, void* pre, const void* inp, const void* weight,
                        const float* bias, DType half, int64_t BT, int64_t C_in,
                        int64_t C_out) override {
    const Span span(*this, "linear_gelu_half", device);
    inner_.linear_gelu_half(device, out, pre, inp, weight, bias, half, BT, C_in, C_out);
  }
  void linear_input_grad_dgelu_half(Device device, void* dpre, float* dbias, const void* dout,
                                    const void* weight, const void* pre, DType half, int64_t BT,
                                    int64_t C_in, int64_t C_out) override {
    const Span span(*this, "linear_input_grad_dgelu_half", device);
    inner_.linear_input_grad_dgelu_half(device, dpre, dbias, dout, weight, pre, half, BT, C_in,
                                        C_out);
  }
  void linear_forward(Device device, float* out, const float* inp, const float* weight,
                      const float* bias, int64_t BT, int64_t C_in, int64_t C_out,
                      const float* residual) override {
    const Span span(*this, "linear_forward", device);
    inner_.linear_forward(device, out, inp, weight, bias, BT, C_in, C_out, residual);
  }
  void linear_backward(Device device, float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, int64_t BT, int64_t C_in,
                       int64_t C_out) override {
    const Span span(*this, "linear_backward", device);
    inner_.linear_backward(device, dinp, dweight, dbias, dout, inp, weight, BT, C_in, C_out);
  }
  void layer_norm_forward(Device device, void* out, DType out_type, float* mean, float* rstd,
                          const float* inp, const float* weight, const float* bias, int64_t N,
                          int64_t C, float eps) override {
    const Span span(*this, "layer_norm_forward", device);
    inner_.layer_norm_forward(device, out, out_type, mean, rstd, inp, weight, bias, N, C, eps);
  }
  void layer_norm_backward(Device device, float* dinp, float* dweight, float* dbias,
                           const void* dout, DType dout_type, const float* inp, const float* weight,
                           const float* mean, const float* rstd, int64_t N, int64_t C,
                           bool accumulate_dinp, void* dinp_half, DType half) override {
    const Span span(*this, "layer_norm_backward", device);
    inner_.layer_norm_backward(device, dinp, dweight, dbias, dout, dout_type, inp, weight, mean,
                               rstd, N, C, accumulate_dinp, dinp_half, half);
  }
  void gelu_forward(Device device, void* out, DType out_type, const void* inp, DType inp_type,
                    int64_t n) override {
    const Span span(*this, "gelu_forward", device);
    inner_.gelu_forward(device, out, out_type, inp, inp_type, n);
  }
  void gelu_forward_half(Device device, void* out, DType out_type, void* inp_half, const float* inp,
                         DType half, int64_t n) override {
    const Span span(*this, "gelu_forward_half", device);
    inner_.gelu_forward_half(device, out, out_type, inp_half, inp, half, n);
  }
  void gelu_backward(Device device, void* dinp, DType dinp_type, const void* inp, DType inp_type,
                     const void* dout, DType dout_type, int64_t n) override {
    const Span span(*this, "gelu_backward", device);
    inner_.gelu_backward(device, dinp, dinp_type, inp, inp_type, dout, dout_type, n);
  }
  void dropout(Device device, float* out, const float* inp, int64_t n, float p, uint64_t seed,
               uint64_t offset) override {
    const Span span(*this, "dropout", device);
    inner_.dropout(device, out, inp, n, p, seed, offset);
  }
  void vocab_lookup_forward(Device device, float* out, const int32_t* idx, const float* table,
                            int64_t N, int64_t C, int64_t begin, int64_t valid) override {
    const Span span(*this, "vocab_lookup_forward", device);
    inner_.vocab_lookup_forward(device, out, idx, table, N, C, begin, valid);
  }
  void vocab_lookup_backward(Device device, float* dtable, const float* dout, const int32_t* idx,
                             int64_t N, int64_t C, int64_t begin, int64_t valid) override {
    const Span span(*this, "vocab_lookup_backward", device);
    inner_.vocab_lookup_backward(device, dtable, dout, idx, N, C, begin, valid);
  }
  void vocab_parallel_row_max(Device device, float* max, const float* logits, int64_t N, int64_t V,
                              int64_t valid) override {
    const Span span(*this, "vocab_parallel_row_max", device);
    inner_.vocab_parallel_row_max(device, max, logits, N, V, valid);
  }
  void vocab_parallel_row_sums(Device device, float* sum, float* target_logit, const float* logits,
                               const float* max, const int32_t* targets, int64_t N, int64_t V,
                               int64_t valid, int64_t begin, int32_t ignore_index) override {
    const Span span(*this, "vocab_parallel_row_sums", device);
    inner_.vocab_parallel_row_sums(device, sum, target_logit, logits, max, targets, N, V, valid,
                                   begin, ignore_index);
  }
  void vocab_parallel_backward(Device device, float* dlogits, const float* logits, const float* max,
                               const float* sum, const int32_t* targets, int64_t N, int64_t V,
                               int64_t valid, int64_t begin, int32_t ignore_index,
                               const float* dloss, const float* count) override {
    const Span span(*this, "vocab_parallel_backward", device);
    inner_.vocab_parallel_backward(device, dlogits, logits, max, sum, targets, N, V, valid, begin,
                                   ignore_index, dloss, count);
  }
  void vocab_parallel_loss_mean(Device device, float* out, const float* max, const float* sum,
                                const float* target_logit, const int32_t* targets, int64_t N,
                                int32_t ignore_index) override {
    const Span span(*this, "vocab_parallel_loss_mean", device);
    inner_.vocab_parallel_loss_mean(device, out, max, sum, target_logit, targets, N, ignore_index);
  }
  void gather_rows(Device device, float* out, const float* src, const int32_t* rows, int64_t n,
                   int64_t C) override {
    const Span span(*this, "gather_rows", device);
    inner_.gather_rows(device, out, src, rows, n, C);
  }
  void scatter_add_rows(Device device, float* out, const float* src, const int32_t* rows,
                        const float* weights, int64_t n, int64_t C) override {
    const Span span(*this, "scatter_add_rows", device);
    inner_.scatter_add_rows(device, out, src, rows, weights, n, C);
  }
  void weighted_rows_backward(Device device, float* dsrc, float* dweights, const float* dout,
                              const float* src, const float* weights, const int32_t* rows,
                              int64_t n, int64_t C) override {
    const Span span(*this, "weighted_rows_backward", device);
    inner_.weighted_rows_backward(device, dsrc, dweights, dout, src, weights, rows, n, C);
  }
  void attention_forward(Device device, float* out, float* att, const float* qkv, int64_t B,
                         int64_t T, int64_t C, int64_t NH) override {
    const Span span(*this, "attention_forward", device);
    inner_.attention_forward(device, out, att, qkv, B, T, C, NH);
  }
  void attention_backward(Device device, float* dqkv, float* scratch, const float* dout,
                          const float* qkv, const float* att, int64_t B, int64_t T, int64_t C,
                          int64_t NH) override {
    const Span span(*this, "attention_backward", device);
    inner_.attention_backward(device, dqkv, scratch, dout, qkv, att, B, T, C, NH);
  }
  bool flash_attention_supported(Device device, int64_t head_size) override {
    return inner_.flash_attention_supported(device, head_size);
  }
  void flash_attention_forward(Device device, void* out, DType out_type, float* lse,
                               const void* qkv, DType half, int64_t B, int64_t T, int64_t C,
                               int64_t NH) override {
    const Span span(*this, "flash_attention_forward", device);
    inner_.flash_attention_forward(device, out, out_type, lse, qkv, half, B, T, C, NH);
  }
  void flash_attention_backward(Device device, void* dqkv, DType dqkv_type, float* scratch,
                                const void* dout, const void* qkv, DType half, const void* out,
                                DType out_type, const float* lse, int64_t B, int64_t T, int64_t C,
                                int64_t NH) override {
    const Span span(*this, "flash_attention_backward", device);
    inner_.flash_attention_backward(device, dqkv, dqkv_type, scratch, dout, qkv, half, out,
                                    out_type, lse, B, T, C, NH);
  }
  void cross_entropy_forward(Device device, float* losses, float* lse, float* mean_loss,
                             const void* logits, DType logits_type, const int32_t* targets,
                             int64_t N, int64_t V, int32_t ignore_index, void* dlogits,
                             float label_smoothing) override {
    const Span span(*this, "cross_entropy_forward", device);
    inner_.cross_entropy_forward(device, losses, lse, mean_loss, logits, logits_type, targets, N, V,
                                 ignore_index, dlogits, label_smoothing);
  }
  void cross_entropy_backward(Device device, void* dlogits, const void* logits, DType logits_type,
                              const float* lse, const int32_t* targets, const float* dloss,
                              int64_t N, int64_t V, int32_t ignore_index,
                              float label_smoothing) override {
    const Span span(*this, "cross_entropy_backward", device);
    inner_.cross_entropy_backward(device, dlogits, logits, logits_type, lse, targets, dloss, N, V,
                                  ignore_index, label_smoothing);
  }
  void gpt_embedding_forward(Device device, float* out, const int32_t* idx, const float* wte,
                             const float* wpe, int64_t B, int64_t T, int64_t C,
                             int64_t V) override {
    const Span span(*this, "gpt_embedding_forward", device);
    inner_.gpt_embedding_forward(device, out, idx, wte, wpe, B, T, C, V);
  }
  void gpt_embedding_backward(Device device, float* dwte, float* dwpe, const float* dout,
                              const int32_t* idx, int64_t B, int64_t T, int64_t C,
                              int64_t V) override {
    const Span span(*this, "gpt_embedding_backward", device);
    inner_.gpt_embedding_backward(device, dwte, dwpe, dout, idx, B, T, C, V);
  }
  void adamw_step(Device device, float* param, const float* grad, float* m, float* v, int64_t n,
                  float lr, float beta1, float beta2, float eps, float weight_decay,
                  int64_t t) override {
    const Span span(*this, "adamw_step", device);
    inner_.adamw_step(device, param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, t);
  }
  void conv2d_forward(Device device, float* out, const float* inp, const float* weight,
                      const float* bias, const cpu::Conv2dShape& s) override {
    const Span span(*this, "conv2d_forward", device);
    inner_.conv2d_forward(device, out, inp, weight, bias, s);
  }
  void conv2d_backward_data(Device device, float* dinp, const float* dout, const float* weight,
                            const cpu::Conv2dShape& s) override {
    const Span span(*this, "conv2d_backward_data", device);
    inner_.conv2d_backward_data(device, dinp, dout, weight, s);
  }
  void conv2d_backward_weights(Device device, float* dweight, float* dbias, const float* dout,
                               const float* inp, const cpu::Conv2dShape& s) override {
    const Span span(*this, "conv2d_backward_weights", device);
    inner_.conv2d_backward_weights(device, dweight, dbias, dout, inp, s);
  }
  void batch_norm_statistics(Device device, double* sums, const float* inp, int64_t N, int64_t C,
                             int64_t HW) override {
    const Span span(*this, "batch_norm_statistics", device);
    inner_.batch_norm_statistics(device, sums, inp, N, C, HW);
  }
  void batch_norm_apply(Device device, float* out, const float* inp, const float* mean,
                        const float* invstd, const float* weight, const float* bias, int64_t N,
                        int64_t C, int64_t HW) override {
    const Span span(*this, "batch_norm_apply", device);
    inner_.batch_norm_apply(device, out, inp, mean, invstd, weight, bias, N, C, HW);
  }
  void batch_norm_backward_reduce(Device device, double* sums, const float* dout, const float* inp,
                                  const float* mean, const float* invstd, int64_t N, int64_t C,
                                  int64_t HW) override {
    const Span span(*this, "batch_norm_backward_reduce", device);
    inner_.batch_norm_backward_reduce(device, sums, dout, inp, mean, invstd, N, C, HW);
  }
  void batch_norm_backward_apply(Device device, float* dinp, const float* dout, const float* inp,
                                 const float* mean, const float* invstd, const float* weight,
                                 const double* sums, int64_t count, int64_t N, int64_t C,
                                 int64_t HW) override {
    const Span span(*this, "batch_norm_backward_apply", device);
    inner_.batch_norm_backward_apply(device, dinp, dout, inp, mean, invstd, weight, sums, count, N,
                                     C, HW);
  }
  void max_pool2d_forward(Device device, float* out, int32_t* argmax, const float* inp,
                          const cpu::Pool2dShape& s) override {
    const Span span(*this, "max_pool2d_forward", device);
    inner_.max_pool2d_forward(device, out, argmax, inp, s);
  }
  void max_pool2d_backward(Device device, float* dinp, const float* dout, const int32_t* argmax,
                           const cpu::Pool2dShape& s) override {
    const Span span(*this, "max_pool2d_backward", device);
    inner_.max_pool2d_backward(device, dinp, dout, argmax, s);
  }
  void avg_pool2d_forward(Device device, float* out, const float* inp, const cpu::Pool2dShape& s,
                          bool count_include_pad) override {
    const Span span(*this, "avg_pool2d_forward", device);
    inner_.avg_pool2d_forward(device, out, inp, s, count_include_pad);
  }
  void avg_pool2d_backward(Device device, float* dinp, const float* dout, const cpu::Pool2dShape& s,
                           bool count_include_pad) override {
    const Span span(*this, "avg_pool2d_backward", device);
    inner_.avg_pool2d_backward(device, dinp, dout, s, count_include_pad);
  }
  void global_avg_pool_forward(Device device, float* out, const float* inp, int64_t N, int64_t C,
                               int64_t HW) override {
    const Span span(*this, "global_avg_pool_forward", device);
    inner_.global_avg_pool_forward(device, out, inp, N, C, HW);
  }
  void global_avg_pool_backward(Device device, float* dinp, const float* dout, int64_t N, int64_t C,
                                int64_t HW) override {
    const Span span(*this, "global_avg_pool_backward", device);
    inner_.global_avg_pool_backward(device, dinp, dout, N, C, HW);
  }
  void relu_forward(Device device, float* out, const float* inp, int64_t n) override {
    const Span span(*this, "relu_forward", device);
    inner_.relu_forward(device, out, inp, n);
  }
  void relu_backward(Device device, float* dinp, const float* dout, const float* out,
                     int64_t n) override {
    const Span span(*this, "relu_backward", device);
    inner_.relu_backward(device, dinp, dout, out, n);
  }

  void sgd_step(Device device, float* param, const float* grad, float* momentum_buf, int64_t n,
                float lr, float momentum, float dampening, float weight_decay, bool nesterov,
                bool first_step) override {
    const Span span(*this, "sgd_step", device);
    inner_.sgd_step(device, param, grad, momentum_buf, n, lr, momentum, dampening, weight_decay,
                    nesterov, first_step);
  }

  void adamw_step_many(Device device, float* const* params, const float* const* grads,
                       float* const* m, float* const* v, const int64_t* ns, const float* decays,
                       int64_t count, float lr, float beta1, float beta2, float eps, int64_t t,
                       float grad_scale, const cpu::StepGate* gate) override {
    const Span span(*this, "adamw_step_many", device);
    inner_.adamw_step_many(device, params, grads, m, v, ns, decays, count, lr, beta1, beta2, eps, t,
                           grad_scale, gate);
  }

 private:
  // Records an event before the call and one after it, on the stream the call queued its work on.
  class Span {
   public:
    Span(KernelProfiler& p, const char* op, Device device);
    ~Span();
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;

   private:
    KernelProfiler& p_;
    const char* op_;
    Device device_;
    cudaEvent_t start_ = nullptr;
  };
  struct Record {
    const char* op;
    cudaEvent_t start, stop;
  };

  DeviceKernels& inner_;
  std::vector<Record> records_;
};

}  // namespace meshtrain::cuda
