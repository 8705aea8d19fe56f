// The Tensor: a handle to contiguous row-major storage with a shape, a dtype and a device.
// Views exist only where they are free (reshape, a range of the first dimension); every other
// layout change is an explicit copy. The handle also carries the autograd metadata (gradient,
// the node that produced it, gradient-ready hooks); the autograd layer fills it in, this layer
// only stores it, so tensor/ never depends on autograd/.
#pragma once

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/tensor/device.h"
#include "meshtrain/tensor/dtype.h"
#include "meshtrain/tensor/storage.h"
#include "meshtrain/util/error.h"

namespace meshtrain {

namespace autograd {
class Node;
}

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& s);
int64_t shape_numel(const Shape& s);
// The rows of a tensor folded over its last dimension: the product of the leading dimensions (1
// for a vector). Not numel / last, which traps for an empty last dimension and is 0 rows there.
int64_t rows_of(const Shape& s);

class Tensor;
struct TensorImpl;
struct AutogradMeta;

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}
template <>
constexpr DType dtype_of<uint8_t>() {
  return DType::u8;
}
template <>
constexpr DType dtype_of<BF16>() {
  return DType::bf16;
}
template <>
constexpr DType dtype_of<F16>() {
  return DType::f16;
}

class Tensor {
 public:
  Tensor() = default;

  // Factories. New tensors never require grad.
  static Tensor empty(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor zeros(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor ones(const Shape& shape, DType dtype = DType::f32, Device device = Device::cpu());
  static Tensor full(const Shape& shape, double value, DType dtype = DType::f32,
                     Device device = Device::cpu());
  static Tensor from_vector(const std::vector<float>& values, const Shape& shape);
  static Tensor from_vector(const std::vector<int32_t>& values, const Shape& shape);
  static Tensor scalar(float value) { return from_vector(std::vector<float>{value}, {}); }
  static Tensor arange(int64_t n, DType dtype = DType::f32);
  // A tensor over memory owned elsewhere (at least numel * dtype size bytes); `owner` keeps it
  // alive for as long as any view of the tensor exists.
  static Tensor from_blob(void* data, const Shape& shape, DType dtype, Device device,
                          std::shared_ptr<const void> owner);

  bool defined() const { return impl_ != nullptr; }
  explicit operator bool() const { return defined(); }
  // True when both handles share one implementation (the same tensor, not equal values).
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  const Shape& shape() const;
  int64_t dim() const { return static_cast<int64_t>(shape().size()); }
  int64_t size(int64_t d) const;  // negative counts from the end
  int64_t numel() const;
  DType dtype() const;
  Device device() const;
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  const std::shared_ptr<Storage>& storage() const;
  size_t storage_offset() const;  // in bytes
  // Whether this handle is the only reference to its memory: no other handle to this tensor (a
  // copy shares it), no other tensor or view on its storage, and the storage not borrowed. Its
  // contents may then be changed in place without anyone else seeing it.
  bool uniquely_held() const;

  void* data_ptr() const;
  template <typename T>
  T* data() const {
    MT_CHECK(dtype() == dtype_of<T>(), "tensor has dtype ", dtype_name(dtype()), ", accessed as ",
             dtype_name(dtype_of<T>()));
    return static_cast<T*>(data_ptr());
  }

  // Views sharing storage (no autograd: the autograd layer has differentiable versions).
  Tensor view(const Shape& shape) const;           // one -1 is inferred
  Tensor slice(int64_t start, int64_t end) const;  // first dimension [start, end)

  // Copies and conversions.
  Tensor clone() const;
  Tensor to(DType dtype) const;
  Tensor to(Device device) const;
  void copy_(const Tensor& src);  // same shape numel; converts dtype
  void fill_(double value);
  void zero_();
  float item() const;                    // numel() == 1, any floating or integer dtype
  std::vector<float> to_vector() const;  // converts to f32
  // Detached handle: shares storage, drops autograd history.
  Tensor detach() const;
  // Points this tensor, and every handle that shares it, at src's storage, shape and dtype,
  // keeping its own autograd metadata (PyTorch's `param.data = src`): how a module's parameters
  // move to another device while the optimizer and the model keep holding the same tensors.
  void set_data(const Tensor& src);

  // Autograd metadata.
  bool requires_grad() const;
  Tensor& set_requires_grad(bool value);
  bool is_leaf() const;
  Tensor grad() const;  // undefined when none
  void set_grad(const Tensor& g);
  const std::shared_ptr<autograd::Node>& grad_fn() const;
  AutogradMeta& autograd_meta() const;  // created on first use
  bool has_autograd_meta() const;

  std::string str() const;  // "Tensor(f32, [2, 3], cpu)"

 private:
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}
  TensorImpl& impl() const;
  std::shared_ptr<TensorImpl> impl_;
};

using GradReadyHook = std::function<void(const Tensor& param)>;

// Set by the autograd layer; lives here so the tensor handle can carry it.
struct AutogradMeta {
  bool requires_grad = false;
  Tensor grad;
  std::shared_ptr<autograd::Node> grad_fn;         // null for leaves
  uint32_t output_nr = 0;                          // which output of grad_fn this tensor is
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves only, shared by graph edges
  std::vector<GradReadyHook> grad_ready_hooks;     // leaves only
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // bytes
  Shape shape;
  DType dtype = DType::f32;
  std::unique_ptr<AutogradMeta> autograd;
};

}  // namespace meshtrain
