// Mixed precision for the matrix products (autocast). While an AutocastGuard names bf16 or f16
// on a thread, linear() and matmul() round both operands (activations and the f32 master
// weights) to that type, multiply with f32 accumulation and return f32; in backward the incoming
// gradient is rounded the same way before each product. causal_attention and gelu read their
// inputs rounded to that type (what they get from a half product under PyTorch's autocast, and
// what flash attention takes on a device), compute in f32 and keep the rounded copy for backward.
// Every other op stays f32, as under PyTorch's autocast, whose list of half-precision ops starts
// with exactly these. GPT's LM head and loss (linear_cross_entropy.h) keep the logits in the half
// type, as PyTorch's autocast does.
//
// An activation between a producer and a consumer that rounds it anyway (a product's input,
// attention's q, k, v, GELU's input) may be handed over in the half type (the ops' out_type):
// the same values in half the bytes, and no cast. As under PyTorch's autocast, the gradient of
// such a half activation is half too (each op writes it so; the engine converts any other), so
// between two products both directions move 2-byte elements; the residual stream, its gradient
// and every parameter gradient stay f32.
//
// On the CPU the rounded values are kept as f32 and multiplied by the f32 GEMM: the product of
// two half-precision numbers is exact in f32, so this is numerically a bf16/f16 GEMM with f32
// accumulation and f32 output (cuBLASLt with A/B in bf16, C/D and compute in f32). It emulates
// the numerics, it is not faster here. The operands a product keeps for backward are stored in
// the half type (2 bytes per element) and widened again exactly when backward needs them.
//
// On a device (cuda) the same roundings feed a real half-precision GEMM (cuBLASLt, half operands,
// f32 accumulation and output), so a model on the device follows its CPU run within the order of
// the sums. There, under bf16 or f16, causal_attention also runs in that type (flash attention:
// half products, f32 softmax; DeviceKernels::flash_attention_forward) where the device supports
// the head size, as PyTorch's scaled_dot_product_attention does on the half-precision outputs of
// its autocast.
#pragma once

#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::autograd {

// The type matrix products round to on this thread; f32 when autocast is off.
DType autocast_dtype();
inline bool autocast_enabled() {
  return autocast_dtype() != DType::f32;
}
// Whether x is an activation in autocast's half type (handed over rounded by its producer).
inline bool is_autocast_half(const Tensor& x) {
  return autocast_enabled() && x.defined() && x.dtype() == autocast_dtype();
}
// The type a producer hands its consumer: autocast's when the consumer takes half inputs (a
// product that would round them anyway), f32 otherwise and outside autocast.
inline DType output_type_for(bool consumer_takes_half) {
  return consumer_takes_half ? autocast_dtype() : DType::f32;
}

// Sets the autocast type for a scope (f32 turns it off); restores the previous one after.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  DType prev_;
};

// Within a scope on this thread, the half copy of each parameter that autocast's products take is
// made once and shared: a step's micro-batches (and an activation-checkpointed segment's
// recomputation) reuse one copy of each weight instead of casting every weight again, as
// PyTorch's autocast reuses its casts within its region. For scopes in which no parameter changes
// (a step's forward and backward passes, before the update); a parameter whose memory moved is
// cast again. The copies go with the scope.
class WeightCastCache {
 public:
  WeightCastCache();
  ~WeightCastCache();
  WeightCastCache(const WeightCastCache&) = delete;
  WeightCastCache& operator=(const WeightCastCache&) = delete;

  // The copy of `weight` in `half`: the scope's, made on first use.
  Tensor get(const Tensor& weight, DType half);

 private:
  struct Entry {
    Tensor weight;
    const void* data;  // where its values were when copied
    Tensor copy;
  };
  std::vector<Entry> entries_;
  WeightCastCache* prev_;
};

// A weight of a product under autocast in the half type, stored so (pack_half): the active
// WeightCastCache's copy for a parameter (a leaf that requires grad), a fresh cast otherwise.
Tensor half_weight(const Tensor& weight, DType half);

// An f32 tensor whose elements are those of `x` rounded to the nearest `half` value (bf16 or
// f16, ties to even; beyond f16's range: infinity).
Tensor round_to(const Tensor& x, DType half);
// `x` rounded and stored as `half` (2 bytes per element), and the exact way back to f32.
Tensor pack_half(const Tensor& x, DType half);
Tensor unpack_half(const Tensor& h);

}  // namespace meshtrain::autograd
