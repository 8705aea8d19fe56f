// The kernels of a non-CPU device as one table of functions on raw pointers, so that the tensor
// core and autograd can run on a device without including its headers: an op on a cuda tensor
// asks device_kernels(DeviceType::cuda) and calls through it. The cuda table (meshtrain/cuda) wraps
// the CUDA kernels and queues them on the device's current stream; tests install a fake table
// (host memory, CPU kernels) to exercise the dispatch on machines without a GPU.
//
// Semantics are those of the CPU kernels in tensor/cpu/ (the reference), with the dimension letters
// of tensor/cpu/kernels.h, except where a comment below says otherwise. All arrays are f32 unless
// typed otherwise and live on `device`. Work may be queued: a function returns before the device
// has finished unless it returns a value to the host.
#pragma once

#include <cstdint>

#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/cpu/pool2d.h"
#include "meshtrain/tensor/cpu/step_gate.h"
#include "meshtrain/tensor/device.h"
#include "meshtrain/tensor/dtype.h"

namespace meshtrain {

// The head sizes flash attention runs on a device (the cuda kernels are instantiated for these);
// the planner's memory model and the fake device of the tests ask the same question here.
inline bool flash_attention_head_size(int64_t head_size) {
  return head_size == 32 || head_size == 64 || head_size == 128;
}

class DeviceKernels {
 public:
  virtual ~DeviceKernels() = default;

  // Elementwise over n elements; out may alias an input.
  virtual void add(Device device, float* out, const float* a, const float* b, int64_t n) = 0;
  // tensor/cpu/reduce.h's add_rows and sum_dim (a broadcast addition and its gradient: ops::add
  // and ops::sum on a device, with the CPU's bits).
  virtual void add_rows(Device device, float* out, const float* a, const float* row, int64_t n,
                        int64_t width) = 0;
  virtual void sum_dim(Device device, float* out, const float* inp, int64_t outer, int64_t mid,
                       int64_t inner) = 0;
  virtual void mul(Device device, float* out, const float* a, const float* b, int64_t n) = 0;
  virtual void scale(Device device, float* out, const float* a, float s, int64_t n) = 0;
  // xs[i][0 .. ns[i]) *= s for i < count (host pointer arrays), each with scale's bits: fewer
  // launches than one per array.
  virtual void scale_many(Device device, float* const* xs, const int64_t* ns, int64_t count,
                          float s) = 0;
  virtual void axpy(Device device, float* y, const float* x, float alpha, int64_t n) = 0;
  // Between floating dtypes, rounding to nearest even like the host's convert().
  virtual void cast(Device device, void* dst, DType dst_type, const void* src, DType src_type,
                    int64_t n) = 0;
  // Sum of x^2 in double; waits for the device (the value comes back to the host).
  virtual double sum_squares(Device device, const float* x, int64_t n) = 0;
  // out[i] (host memory) = sum_squares of xs[i] (ns[i] elements) for i < count, each with the bits
  // sum_squares gives it; waits for the device once for all of them (the gradient norm of a model
  // with hundreds of parameters, without a wait per parameter).
  virtual void sum_squares_each(Device device, const float* const* xs, const int64_t* ns,
                                int64_t count, double* out) = 0;
  // sum_squares_each with the sums left on the device (out: `count` doubles of device memory),
  // no wait: the norm of a step decided on the device (step_gate).
  virtual void sum_squares_each_on_device(Device device, const float* const* xs, const int64_t* ns,
                                          int64_t count, double* out) = 0;
  // cpu::step_gate with its arrays and `out` in device memory; no wait.
  virtual void step_gate(Device device, cpu::StepGate* out, const float* losses, int64_t accum,
                         const double* pre, int64_t n_pre, const double* sums, int64_t n_split,
                         int64_t n, double max_norm, double epsilon) = 0;

  // out[batch][M, N] = op(a) @ op(b) for each of `batch` products, row-major (ops::matmul's
  // conventions: a is [M, K], or [K, M] when trans_a; b is [K, N], or [N, K] when trans_b).
  // stride_a and stride_b are the elements between consecutive matrices (0: one shared matrix);
  // the outputs are contiguous.
  virtual void matmul(Device device, float* out, const float* a, const float* b, int64_t batch,
                      int64_t M, int64_t N, int64_t K, bool trans_a, bool trans_b, int64_t stride_a,
                      int64_t stride_b) = 0;

  // Autocast's product (autograd/autocast.h): out[batch][M, N] = op(a) @ op(b) (+ bias[N], f32,
  // on every row; may be null) with a and b in `half` (bf16 or f16) and f32 accumulation; out is
  // written, not accumulated into. out_type is f32, or `half` for the product (and bias) rounded
  // once on the way out (the input of a half consumer, the logits kept for the cross-entropy).
  // The conventions of matmul otherwise. With a residual (f32 [M, N], one product, f32 out):
  // out = residual + the product (+ bias), summed where the product is written. `alpha` scales
  // the f32 product before anything is added to it or it is rounded (a GEMM's alpha). A bias
  // with a half output is for one product (batch 1).
  virtual void matmul_half(Device device, void* out, DType out_type, const void* a, const void* b,
                           DType half, const float* bias, int64_t batch, int64_t M, int64_t N,
                           int64_t K, bool trans_a, bool trans_b, int64_t stride_a,
                           int64_t stride_b, const float* residual, float alpha) = 0;

  // dbias[C] = the sums over rows of dout[N, C] (f32, bf16 or f16: dout_type), in f32; written.
  // Autocast's bias gradient, from the gradient its products take in the half type.
  virtual void bias_grad(Device device, float* dbias, const void* dout, DType dout_type, int64_t N,
                         int64_t C) = 0;

  // Autocast's weight and bias gradients of linear: dweight[C_out, C_in] = dout^T @ inp (dout
  // [BT, C_out] and inp [BT, C_in] in `half`, f32 accumulation; written) and dbias[C_out] =
  // bias_grad(dout); either may be null. The values of matmul_half and bias_grad; a device may
  // sum the bias gradient from the product's own reads of dout, in its own order. `alpha` scales
  // the weight gradient's f32 product (a GEMM's alpha); a bias gradient comes with alpha 1 only.
  virtual void weight_grad_half(Device device, float* dweight, float* dbias, const void* dout,
                                const void* inp, DType half, int64_t BT, int64_t C_in,
                                int64_t C_out, float alpha) = 0;

  // The MLP's first product under autocast with GELU where it writes (autograd::gelu_mlp):
  // pre[BT, C_out] = inp[BT, C_in] @ weight[C_out, C_in]^T + bias (f32, may be null) in f32,
  // rounded to `half` (GELU's input, kept for the backward), and out[BT, C_out] = gelu of that
  // f32 sum (not of its rounded copy), rounded to `half`. inp and weight in `half`.
  virtual void linear_gelu_half(Device device, void* out, void* pre, const void* inp,
                                const void* weight, const float* bias, DType half, int64_t BT,
                                int64_t C_in, int64_t C_out) = 0;
  // The input gradient of a product whose input was gelu(pre), with GELU's backward where it
  // writes: dpre[BT, C_in] = gelu'(pre) * (dout[BT, C_out] @ weight[C_out, C_in]) of the f32
  // product, rounded once to `half`; dbias[C_in] (may be null) = the column sums of dpre, written
  // (the first product's bias gradient): of the rounded dpre on the CPU; cuBLASLt's DGELU_BGRAD
  // epilogue may sum the f32 values before their rounding (within a half rounding per term; an
  // f16 dpre that overflows can then leave a finite sum). dout, weight and pre in `half`.
  virtual void linear_input_grad_dgelu_half(Device device, void* dpre, float* dbias,
                                            const void* dout, const void* weight, const void* pre,
                                            DType half, int64_t BT, int64_t C_in,
                                            int64_t C_out) = 0;

  // nn.Linear: out[BT, C_out] = inp[BT, C_in] @ weight[C_out, C_in]^T + bias (may be null), plus
  // residual[BT, C_out] where it is not null.
  virtual void linear_forward(Device device, float* out, const float* inp, const float* weight,
                              const float* bias, int64_t BT, int64_t C_in, int64_t C_out,
                              const float* residual) = 0;
  // WRITES (does not accumulate) dinp[BT, C_in], dweight[C_out, C_in] and dbias[C_out]; each may
  // be null. Fresh gradient buffers then need no zero-fill.
  virtual void linear_backward(Device device, float* dinp, float* dweight, float* dbias,
                               const float* dout, const float* inp, const float* weight, int64_t BT,
                               int64_t C_in, int64_t C_out) = 0;

  // out in f32, or rounded once to bf16/f16 (out_type: for a half product).
  virtual void layer_norm_forward(Device device, void* out, DType out_type, float* mean,
                                  float* rstd, const float* inp, const float* weight,
                                  const float* bias, int64_t N, int64_t C, float eps) = 0;
  // Writes dinp (or with accumulate_dinp adds to it: a gradient summed already), and dweight and
  // dbias (each may be null; written, not accumulated). dout is f32 or autocast's half type
  // (dout_type: a half output's gradient is half). dinp_half (may be null) receives what dinp
  // receives, rounded once to `half` (bf16 or f16): the copy a half product downstream would
  // otherwise cast.
  virtual void layer_norm_backward(Device device, float* dinp, float* dweight, float* dbias,
                                   const void* dout, DType dout_type, const float* inp,
                                   const float* weight, const float* mean, const float* rstd,
                                   int64_t N, int64_t C, bool accumulate_dinp, void* dinp_half,
                                   DType half) = 0;

  // Each array f32 or a half type (a half product's output in, a half product's input out).
  virtual void gelu_forward(Device device, void* out, DType out_type, const void* inp,
                            DType inp_type, int64_t n) = 0;
  // Autocast's GELU: inp rounded to `half` (bf16 or f16) into inp_half, kept for the backward,
  // and out = gelu of the rounded values, in f32 or rounded to `half` (out_type).
  virtual void gelu_forward_half(Device device, void* out, DType out_type, void* inp_half,
                                 const float* inp, DType half, int64_t n) = 0;
  // Writes dinp; inp is f32, or the half copy gelu_forward_half kept (inp_type).
  virtual void gelu_backward(Device device, void* dinp, DType dinp_type, const void* inp,
                             DType inp_type, const void* dout, DType dout_type, int64_t n) = 0;

  // Inverted dropout with the CPU's mask (tensor/dropout_mask.h): out[i] = inp[i] / (1 - p) where
  // element offset + i is kept under seed, else 0 (written; out may be inp). The backward is the
  // same call on the incoming gradient.
  virtual void dropout(Device device, float* out, const float* inp, int64_t n, float p,
                       uint64_t seed, uint64_t offset) = 0;

  // Rows moved by an index, tensor/cpu/index_rows.h's semantics (a mixture of experts' dispatch
  // and combine); `rows` is device memory, and scatter_add_rows' rows are distinct.
  virtual void gather_rows(Device device, float* out, const float* src, const int32_t* rows,
                           int64_t n, int64_t C) = 0;
  virtual void scatter_add_rows(Device device, float* out, const float* src, const int32_t* rows,
                                const float* weights, int64_t n, int64_t C) = 0;
  virtual void weighted_rows_backward(Device device, float* dsrc, float* dweights,
                                      const float* dout, const float* src, const float* weights,
                                      const int32_t* rows, int64_t n, int64_t C) = 0;

  // Causal attention over qkv[B, T, 3C]: out[B, T, C], att[B, NH, T, T] saved for the backward.
  virtual void attention_forward(Device device, float* out, float* att, const float* qkv, int64_t B,
                                 int64_t T, int64_t C, int64_t NH) = 0;
  // Writes dqkv; scratch holds B * NH * T * T floats.
  virtual void attention_backward(Device device, float* dqkv, float* scratch, const float* dout,
                                  const float* qkv, const float* att, int64_t B, int64_t T,
                                  int64_t C, int64_t NH) = 0;

  // Causal attention under bf16 or f16 autocast without the T x T matrix (FlashAttention-2's
  // algorithm): whether this device runs it for heads of `head_size` (else causal_attention uses
  // the entries above); out[B, T, C] and lse[B, NH, T] (each row's logsumexp) from qkv, given in
  // `half` (bf16 or f16: the rounded copy autograd keeps for the backward); the backward writes
  // dqkv (f32 or `half`: dqkv_type) and uses scratch of B * NH * T floats. Products in `half`
  // with f32 accumulation, so the result follows attention_forward on the same rounded q, k, v
  // within half-precision tolerance.
  virtual bool flash_attention_supported(Device device, int64_t head_size) = 0;
  // out is f32 or `half` (out_type: the output rounded once, for a half product; the backward
  // then takes that copy, and dout of the same type).
  virtual void flash_attention_forward(Device device, void* out, DType out_type, float* lse,
                                       const void* qkv, DType half, int64_t B, int64_t T, int64_t C,
                                       int64_t NH) = 0;
  virtual void flash_attention_backward(Device device, void* dqkv, DType dqkv_type, float* scratch,
                                        const void* dout, const void* qkv, DType half,
                                        const void* out, DType out_type, const float* lse,
                                        int64_t B, int64_t T, int64_t C, int64_t NH) = 0;

  // losses[N], lse[N] and the mean loss written to *mean_loss (device memory, so that reading it
  // is the caller's choice). A bad target gives NaN instead of an error (a kernel cannot throw).
  // logits are f32, bf16 or f16 (logits_type), widened exactly; the arithmetic is f32. Where
  // dlogits is not null the same pass over each row also writes the gradient of the mean loss,
  // cross_entropy_backward's with dloss = 1 (a caller scales it where it is read, by a product's
  // alpha): the logits are read once for loss and gradient. dlogits may be the logits.
  // label_smoothing in [0, 1): tensor/cpu/cross_entropy.h's (PyTorch's) smoothed target.
  virtual void cross_entropy_forward(Device device, float* losses, float* lse, float* mean_loss,
                                     const void* logits, DType logits_type, const int32_t* targets,
                                     int64_t N, int64_t V, int32_t ignore_index, void* dlogits,
                                     float label_smoothing) = 0;
  // Writes dlogits = (softmax - target) * dloss / count, the target onehot or smoothed;
  // count = non-ignored rows. dloss (the incoming gradient) is a device scalar and count is
  // taken on the device: no host wait. dlogits has the logits' type (each value rounded once)
  // and may be the logits themselves.
  virtual void cross_entropy_backward(Device device, void* dlogits, const void* logits,
                                      DType logits_type, const float* lse, const int32_t* targets,
                                      const float* dloss, int64_t N, int64_t V,
                                      int32_t ignore_index, float label_smoothing) = 0;

  virtual void gpt_embedding_forward(Device device, float* out, const int32_t* idx,
                                     const float* wte, const float* wpe, int64_t B, int64_t T,
                                     int64_t C, int64_t V) = 0;
  // Accumulates; either gradient may be null. dwte[v] += the sum over token v's positions added
  // up in position order from zero (a table holding another gradient gets that gradient plus
  // this one, as a separate addition: how the tied LM head's gradient takes the embedding's);
  // dwpe[t] += the sum over the batch, in batch order from zero. Into zero tables these are the
  // CPU kernel's bits; into held gradients they may differ from the CPU's, which adds each
  // position into the table in turn.
  virtual void gpt_embedding_backward(Device device, float* dwte, float* dwpe, const float* dout,
                                      const int32_t* idx, int64_t B, int64_t T, int64_t C,
                                      int64_t V) = 0;

  // A vocabulary-parallel table and loss (tensor parallelism): tensor/cpu/embedding.h's
  // vocab_lookup_* and tensor/cpu/vocab_parallel_cross_entropy.h's parts; idx and targets are
  // device memory. The loss's mean and count are written to device memory, and the backward's
  // scale is *dloss / *count, both device scalars: no host read.
  virtual void vocab_lookup_forward(Device device, float* out, const int32_t* idx,
                                    const float* table, int64_t N, int64_t C, int64_t begin,
                                    int64_t valid) = 0;
  virtual void vocab_lookup_backward(Device device, float* dtable, const float* dout,
                                     const int32_t* idx, int64_t N, int64_t C, int64_t begin,
                                     int64_t valid) = 0;
  virtual void vocab_parallel_row_max(Device device, float* max, const float* logits, int64_t N,
                                      int64_t V, int64_t valid) = 0;
  virtual void vocab_parallel_row_sums(Device device, float* sum, float* target_logit,
                                       const float* logits, const float* max,
                                       const int32_t* targets, int64_t N, int64_t V, int64_t valid,
                                       int64_t begin, int32_t ignore_index) = 0;
  virtual void vocab_parallel_backward(Device device, float* dlogits, const float* logits,
                                       const float* max, const float* sum, const int32_t* targets,
                                       int64_t N, int64_t V, int64_t valid, int64_t begin,
                                       int32_t ignore_index, const float* dloss,
                                       const float* count) = 0;
  virtual void vocab_parallel_loss_mean(Device device, float* out, const float* max,
                                        const float* sum, const float* target_logit,
                                        const int32_t* targets, int64_t N,
                                        int32_t ignore_index) = 0;

  // The vision layers (autograd/vision.h, NCHW): the semantics of tensor/cpu/conv2d.h,
  // batch_norm.h, pool2d.h and relu.h. Convolutions run in f32 unless TF32 is allowed for
  // matrix products (train.tf32, as the GEMMs); the backward entries WRITE dinp, dweight and dbias
  // (each may be null).
  virtual void conv2d_forward(Device device, float* out, const float* inp, const float* weight,
                              const float* bias, const cpu::Conv2dShape& s) = 0;
  virtual void conv2d_backward_data(Device device, float* dinp, const float* dout,
                                    const float* weight, const cpu::Conv2dShape& s) = 0;
  virtual void conv2d_backward_weights(Device device, float* dweight, float* dbias,
                                       const float* dout, const float* inp,
                                       const cpu::Conv2dShape& s) = 0;
  // Batch norm's four steps. Its per-channel values cross ranks and are combined on the host, so
  // `sums` (2C doubles), `mean` and `invstd` (C floats each) are HOST memory; the two reductions
  // wait for the device (their sums come back to the host).
  virtual void batch_norm_statistics(Device device, double* sums, const float* inp, int64_t N,
                                     int64_t C, int64_t HW) = 0;
  virtual void batch_norm_apply(Device device, float* out, const float* inp, const float* mean,
                                const float* invstd, const float* weight, const float* bias,
                                int64_t N, int64_t C, int64_t HW) = 0;
  virtual void batch_norm_backward_reduce(Device device, double* sums, const float* dout,
                                          const float* inp, const float* mean, const float* invstd,
                                          int64_t N, int64_t C, int64_t HW) = 0;
  virtual void batch_norm_backward_apply(Device device, float* dinp, const float* dout,
                                         const float* inp, const float* mean, const float* invstd,
                                         const float* weight, const double* sums, int64_t count,
                                         int64_t N, int64_t C, int64_t HW) = 0;
  // Pooling; the backward entries ACCUMULATE into dinp, as the CPU's.
  virtual void max_pool2d_forward(Device device, float* out, int32_t* argmax, const float* inp,
                                  const cpu::Pool2dShape& s) = 0;
  virtual void max_pool2d_backward(Device device, float* dinp, const float* dout,
                                   const int32_t* argmax, const cpu::Pool2dShape& s) = 0;
  virtual void avg_pool2d_forward(Device device, float* out, const float* inp,
                                  const cpu::Pool2dShape& s, bool count_include_pad) = 0;
  virtual void avg_pool2d_backward(Device device, float* dinp, const float* dout,
                                   const cpu::Pool2dShape& s, bool count_include_pad) = 0;
  virtual void global_avg_pool_forward(Device device, float* out, const float* inp, int64_t N,
                                       int64_t C, int64_t HW) = 0;
  virtual void global_avg_pool_backward(Device device, float* dinp, const float* dout, int64_t N,
                                        int64_t C, int64_t HW) = 0;
  // out = max(inp, 0); dinp = dout where out > 0, else 0 (written).
  virtual void relu_forward(Device device, float* out, const float* inp, int64_t n) = 0;
  virtual void relu_backward(Device device, float* dinp, const float* dout, const float* out,
                             int64_t n) = 0;

  // One SGD step, tensor/cpu/sgd.h's semantics (momentum_buf may be null without momentum).
  virtual void sgd_step(Device device, float* param, const float* grad, float* momentum_buf,
                        int64_t n, float lr, float momentum, float dampening, float weight_decay,
                        bool nesterov, bool first_step) = 0;

  // One AdamW step t (>= 1), torch.optim.AdamW semantics (tensor/cpu/adamw.h).
  virtual void adamw_step(Device device, float* param, const float* grad, float* m, float* v,
                          int64_t n, float lr, float beta1, float beta2, float eps,
                          float weight_decay, int64_t t) = 0;
  // adamw_step over `count` tensors at once (tensor i: params[i], grads[i], m[i], v[i], ns[i]
  // elements, weight decay decays[i]; the same step t), each element with adamw_step's bits;
  // the pointer arrays are host memory. Fewer launches than one per tensor. Each gradient is
  // read times grad_scale (cpu::adamw_step's: the bits of scaling it first). With a gate (device
  // memory, step_gate's; may be null) the device decides: a step it skips changes nothing, and
  // its coef replaces grad_scale.
  virtual void adamw_step_many(Device device, float* const* params, const float* const* grads,
                               float* const* m, float* const* v, const int64_t* ns,
                               const float* decays, int64_t count, float lr, float beta1,
                               float beta2, float eps, int64_t t, float grad_scale,
                               const cpu::StepGate* gate) = 0;
};

// Installs the kernel table of a device type (the cuda one defaults to meshtrain/cuda's when
// built with CUDA). nullptr restores the default. Not for DeviceType::cpu, whose kernels are
// called directly.
void set_device_kernels(DeviceType type, DeviceKernels* kernels);

// The table for `device`; throws naming `op` and the reason when there is none (built without
// CUDA).
DeviceKernels& device_kernels(Device device, const char* op);

}  // namespace meshtrain
