#include "meshtrain/tensor/tensor.h"

#include <cstring>
#include <sstream>

#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) {
    MT_CHECK(d >= 0, "negative dimension in shape ", shape_str(s));
    n *= d;
  }
  return n;
}

int64_t rows_of(const Shape& s) {
  int64_t n = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
  return n;
}

TensorImpl& Tensor::impl() const {
  MT_CHECK(impl_ != nullptr, "use of an undefined tensor");
  return *impl_;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(
      static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device);
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::from_blob(void* data, const Shape& shape, DType dtype, Device device,
                         std::shared_ptr<const void> owner) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(
      data, static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), device, std::move(owner));
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.zero_();
  return t;
}

Tensor Tensor::ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device) {
  Tensor t = empty(shape, dtype, device);
  t.fill_(value);
  return t;
}

Tensor Tensor::from_vector(const std::vector<float>& values, const Shape& shape) {
  MT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_vector: ", values.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::f32);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(float));
  return t;
}

Tensor Tensor::from_vector(const std::vector<int32_t>& values, const Shape& shape) {
  MT_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
           "from_vector: ", values.size(), " values for shape ", shape_str(shape));
  Tensor t = empty(shape, DType::i32);
  if (!values.empty()) std::memcpy(t.data_ptr(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

Tensor Tensor::arange(int64_t n, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(i);
  return from_vector(v, {n}).to(dtype);
}

const Shape& Tensor::shape() const {
  return impl().shape;
}

int64_t Tensor::size(int64_t d) const {
  const int64_t n = dim();
  const int64_t i = d < 0 ? d + n : d;
  MT_CHECK(i >= 0 && i < n, "dimension ", d, " out of range for shape ", shape_str(shape()));
  return shape()[static_cast<size_t>(i)];
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : impl().shape) n *= d;
  return n;
}

DType Tensor::dtype() const {
  return impl().dtype;
}
Device Tensor::device() const {
  return impl().storage->device();
}
const std::shared_ptr<Storage>& Tensor::storage() const {
  return impl().storage;
}
bool Tensor::uniquely_held() const {
  return impl_ != nullptr && impl_.use_count() == 1 && impl_->storage != nullptr &&
         impl_->storage.use_count() == 1 && !impl_->storage->borrowed();
}
size_t Tensor::storage_offset() const {
  return impl().offset;
}

void* Tensor::data_ptr() const {
  const TensorImpl& i = impl();
  if (i.storage->data() == nullptr) return nullptr;
  return static_cast<char*>(i.storage->data()) + i.offset;
}

Tensor Tensor::view(const Shape& shape) const {
  Shape s = shape;
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      MT_CHECK(infer < 0, "view: more than one -1 in ", shape_str(shape));
      infer = static_cast<int>(i);
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    MT_CHECK(known > 0 && numel() % known == 0, "view: cannot infer -1 in ", shape_str(shape),
             " from ", numel(), " elements");
    s[static_cast<size_t>(infer)] = numel() / known;
  }
  MT_CHECK(shape_numel(s) == numel(), "view: shape ", shape_str(shape), " does not fit ",
           shape_str(this->shape()));
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->offset = impl().offset;
  v->shape = std::move(s);
  v->dtype = impl().dtype;
  return Tensor(std::move(v));
}

Tensor Tensor::slice(int64_t start, int64_t end) const {
  MT_CHECK(dim() >= 1, "slice of a 0-d tensor");
  const int64_t n = shape()[0];
  MT_CHECK(0 <= start && start <= end && end <= n, "slice [", start, ", ", end,
           ") out of range for first dimension ", n);
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->shape = shape();
  v->shape[0] = end - start;
  v->dtype = impl().dtype;
  const int64_t row = n == 0 ? 0 : numel() / n;
  v->offset = impl().offset + static_cast<size_t>(start * row) * dtype_size(dtype());
  return Tensor(std::move(v));
}

Tensor Tensor::clone() const {
  Tensor t = empty(shape(), dtype(), device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(DType dt) const {
  if (dt == dtype()) return *this;
  Tensor t = empty(shape(), dt, device());
  t.copy_(*this);
  return t;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor t = empty(shape(), dtype(), d);
  t.copy_(*this);
  return t;
}

void Tensor::copy_(const Tensor& src) {
  MT_CHECK(src.numel() == numel(), "copy_: ", shape_str(src.shape()), " into ", shape_str(shape()));
  if (numel() == 0) return;
  if (src.device().is_cpu() && device().is_cpu()) {
    convert(src.data_ptr(), src.dtype(), data_ptr(), dtype(), static_cast<size_t>(numel()));
    return;
  }
  // A device is involved: bytes move through its allocator. A dtype change between floating
  // dtypes on one device is a device cast; any other converts on the host (a slow path).
  if (src.dtype() == dtype()) {
    const DeviceType other = device().is_cpu() ? src.device().type : device().type;
    allocator_for(other).copy(data_ptr(), device(), src.data_ptr(), src.device(), nbytes());
    return;
  }
  if (src.device() == device() && is_floating(src.dtype()) && is_floating(dtype())) {
    device_kernels(device(), "copy_ (cast)")
        .cast(device(), data_ptr(), dtype(), src.data_ptr(), src.dtype(), numel());
    return;
  }
  const Tensor host_src = src.to(Device::cpu());
  if (device().is_cpu()) {
    copy_(host_src);
  } else {
    copy_(host_src.to(dtype()));
  }
}

void Tensor::fill_(double value) {
  if (!device().is_cpu()) {
    if (value == 0.0) {
      zero_();
    } else {
      copy_(full(shape(), value, dtype()));
    }
    return;
  }
  const size_t n = static_cast<size_t>(numel());
  if (n == 0) return;
  if (dtype() == DType::f32) {
    float* p = static_cast<float*>(data_ptr());
    const float v = static_cast<float>(value);
    for (size_t i = 0; i < n; ++i) p[i] = v;
    return;
  }
  const float v = static_cast<float>(value);
  const size_t esz = dtype_size(dtype());
  std::vector<unsigned char> one(esz);
  convert(&v, DType::f32, one.data(), dtype(), 1);
  unsigned char* p = static_cast<unsigned char*>(data_ptr());
  for (size_t i = 0; i < n; ++i) std::memcpy(p + i * esz, one.data(), esz);
}

void Tensor::zero_() {
  if (numel() == 0) return;
  if (device().is_cpu()) {
    std::memset(data_ptr(), 0, nbytes());
  } else {
    allocator_for(device().type).zero(data_ptr(), nbytes(), device());
  }
}

float Tensor::item() const {
  MT_CHECK(numel() == 1, "item() needs exactly one element, tensor has shape ", shape_str(shape()));
  if (!device().is_cpu()) return to(Device::cpu()).item();
  float v;
  convert(data_ptr(), dtype(), &v, DType::f32, 1);
  return v;
}

std::vector<float> Tensor::to_vector() const {
  if (!device().is_cpu()) return to(Device::cpu()).to_vector();
  std::vector<float> v(static_cast<size_t>(numel()));
  if (!v.empty()) convert(data_ptr(), dtype(), v.data(), DType::f32, v.size());
  return v;
}

Tensor Tensor::detach() const {
  if (!impl_) return Tensor();
  auto v = std::make_shared<TensorImpl>();
  v->storage = impl().storage;
  v->offset = impl().offset;
  v->shape = impl().shape;
  v->dtype = impl().dtype;
  return Tensor(std::move(v));
}

void Tensor::set_data(const Tensor& src) {
  TensorImpl& dst = impl();
  const TensorImpl& from = src.impl();
  dst.storage = from.storage;
  dst.offset = from.offset;
  dst.shape = from.shape;
  dst.dtype = from.dtype;
}

bool Tensor::requires_grad() const {
  return impl_ && impl_->autograd && impl_->autograd->requires_grad;
}

Tensor& Tensor::set_requires_grad(bool value) {
  if (value) {
    MT_CHECK(is_floating(dtype()), "only floating-point tensors can require gradients, not ",
             dtype_name(dtype()));
  }
  autograd_meta().requires_grad = value;
  return *this;
}

bool Tensor::is_leaf() const {
  return !impl_ || !impl_->autograd || !impl_->autograd->grad_fn;
}

Tensor Tensor::grad() const {
  return impl_ && impl_->autograd ? impl_->autograd->grad : Tensor();
}

void Tensor::set_grad(const Tensor& g) {
  autograd_meta().grad = g;
}

const std::shared_ptr<autograd::Node>& Tensor::grad_fn() const {
  static const std::shared_ptr<autograd::Node> kNone;
  return impl_ && impl_->autograd ? impl_->autograd->grad_fn : kNone;
}

AutogradMeta& Tensor::autograd_meta() const {
  TensorImpl& i = impl();
  if (!i.autograd) i.autograd = std::make_unique<AutogradMeta>();
  return *i.autograd;
}

bool Tensor::has_autograd_meta() const {
  return impl_ && impl_->autograd;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor(" + std::string(dtype_name(dtype())) + ", " + shape_str(shape()) + ", " +
         device().str() + ")";
}

}  // namespace meshtrain
