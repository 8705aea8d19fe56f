#include "meshtrain/autograd/autocast.h"

#include "meshtrain/tensor/cpu/parallel.h"

namespace meshtrain::autograd {
namespace {

thread_local DType g_autocast = DType::f32;

void check_half(DType half) {
  MT_CHECK(half == DType::bf16 || half == DType::f16, "autocast type must be bf16 or f16, got ",
           dtype_name(half));
}

inline uint16_t to_bits(float v, bool bf16) {
  return bf16 ? f32_to_bf16(v) : f32_to_f16(v);
}
inline float from_bits(uint16_t b, bool bf16) {
  return bf16 ? bf16_to_f32(b) : f16_to_f32(b);
}

void check_f32_cpu(const Tensor& x, const char* what) {
  MT_CHECK(x.defined() && x.dtype() == DType::f32 && x.device().is_cpu(), what,
           ": expects an f32 cpu tensor, got ", x.defined() ? x.str() : "an undefined tensor");
}

}  // namespace

DType autocast_dtype() {
  return g_autocast;
}

AutocastGuard::AutocastGuard(DType dtype) : prev_(g_autocast) {
  if (dtype != DType::f32) check_half(dtype);
  g_autocast = dtype;
}

AutocastGuard::~AutocastGuard() {
  g_autocast = prev_;
}

Tensor round_to(const Tensor& x, DType half) {
  check_half(half);
  // On a device: two casts there (round to the half type, widen exactly).
  if (x.defined() && x.dtype() == DType::f32 && !x.device().is_cpu())
    return x.to(half).to(DType::f32);
  check_f32_cpu(x, "round_to");
  Tensor out = Tensor::empty(x.shape());
  const float* src = x.data<float>();
  float* dst = out.data<float>();
  const int64_t n = x.numel();
  const bool bf16 = half == DType::bf16;
#pragma omp parallel for schedule(static) if (cpu::worth_parallel(n))
  for (int64_t i = 0; i < n; ++i) dst[i] = from_bits(to_bits(src[i], bf16), bf16);
  return out;
}

Tensor pack_half(const Tensor& x, DType half) {
  check_half(half);
  check_f32_cpu(x, "pack_half");
  return x.to(half);
}

namespace {

thread_local WeightCastCache* g_weight_cache = nullptr;

// pack_half's values on any device.
Tensor cast_weight(const Tensor& weight, DType half) {
  check_half(half);
  MT_CHECK(weight.defined() && weight.dtype() == DType::f32,
           "autocast: a weight is f32 (the master copy), got ",
           weight.defined() ? weight.str() : "an undefined tensor");
  return weight.to(half);
}

}  // namespace

WeightCastCache::WeightCastCache() : prev_(g_weight_cache) {
  g_weight_cache = this;
}

WeightCastCache::~WeightCastCache() {
  g_weight_cache = prev_;
}

Tensor WeightCastCache::get(const Tensor& weight, DType half) {
  for (Entry& e : entries_) {
    if (!e.weight.is_same(weight) || e.copy.dtype() != half) continue;
    if (e.data != weight.data_ptr()) {
      e.copy = cast_weight(weight, half);
      e.data = weight.data_ptr();
    }
    return e.copy;
  }
  entries_.push_back({weight, weight.data_ptr(), cast_weight(weight, half)});
  return entries_.back().copy;
}

Tensor half_weight(const Tensor& weight, DType half) {
  if (g_weight_cache != nullptr && weight.is_leaf() && weight.requires_grad())
    return g_weight_cache->get(weight, half);
  return cast_weight(weight, half);
}

Tensor unpack_half(const Tensor& h) {
  check_half(h.dtype());
  return h.to(DType::f32);
}

}  // namespace meshtrain::autograd
