#include "meshtrain/tensor/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/reduce.h"
#include "meshtrain/tensor/device_kernels.h"
#include "meshtrain/tensor/storage.h"

namespace meshtrain::ops {
namespace {

constexpr int64_t kParallelGrain = 1 << 15;

void check_cpu_f32(const Tensor& t, const char* op) {
  MT_CHECK(t.defined(), op, ": undefined tensor");
  MT_CHECK(t.device().is_cpu(), op, " is not supported on ", t.device().str(),
           " (it runs on the CPU only)");
  MT_CHECK(t.dtype() == DType::f32, op, " supports f32, got ", dtype_name(t.dtype()));
}

// Device operands: defined, f32, all on the first one's device. Returns that device's kernels.
DeviceKernels& device_f32(const char* op, std::initializer_list<const Tensor*> ts) {
  const Device d = (*ts.begin())->device();
  for (const Tensor* t : ts) {
    MT_CHECK(t->defined(), op, ": undefined tensor");
    MT_CHECK(t->device() == d, op, ": operands on ", d.str(), " and ", t->device().str());
    MT_CHECK(t->dtype() == DType::f32, op, " on ", d.str(), " supports f32, got ",
             dtype_name(t->dtype()));
  }
  return device_kernels(d, op);
}

bool on_device(const Tensor& a) {
  return a.defined() && !a.device().is_cpu();
}

// Whether `row` broadcasts over the leading dimensions of `shape` only: its shape, leading ones
// dropped, ends `shape` (a bias [C] under [B, T, C], a position table [T, C]).
bool repeats_over_leading(const Shape& row, const Shape& shape) {
  if (row.size() > shape.size()) return false;  // the sum would have the row's rank
  size_t skip = 0;
  while (skip < row.size() && row[skip] == 1) ++skip;
  const size_t n = row.size() - skip;
  if (n > shape.size()) return false;
  return std::equal(row.begin() + static_cast<std::ptrdiff_t>(skip), row.end(),
                    shape.end() - static_cast<std::ptrdiff_t>(n));
}

Tensor binary_on_device(BinaryOp op, const Tensor& a, const Tensor& b) {
  DeviceKernels& k = device_f32("binary op", {&a, &b});
  // An addition of a row repeated over the leading dimensions (either way round: a + b is b + a
  // bit for bit).
  if (op == BinaryOp::add && a.shape() != b.shape()) {
    const bool b_row = repeats_over_leading(b.shape(), a.shape());
    if (b_row || repeats_over_leading(a.shape(), b.shape())) {
      const Tensor& whole = b_row ? a : b;
      const Tensor& row = b_row ? b : a;
      Tensor out = Tensor::empty(whole.shape(), DType::f32, whole.device());
      k.add_rows(a.device(), out.data<float>(), whole.data<float>(), row.data<float>(),
                 whole.numel(), row.numel());
      return out;
    }
  }
  MT_CHECK(a.shape() == b.shape(), "binary op on ", a.device().str(),
           " needs equal shapes (or an addition of a row over the leading dimensions), got ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  Tensor out = Tensor::empty(a.shape(), DType::f32, a.device());
  float* o = out.data<float>();
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  switch (op) {
    case BinaryOp::add:
      k.add(a.device(), o, pa, pb, a.numel());
      break;
    case BinaryOp::mul:
      k.mul(a.device(), o, pa, pb, a.numel());
      break;
    case BinaryOp::sub:
      k.scale(a.device(), o, pb, -1.0f, a.numel());
      k.add(a.device(), o, pa, o, a.numel());
      break;
    case BinaryOp::div:
      MT_THROW(Error, "div is not supported on ", a.device().str(), " (it runs on the CPU only)");
  }
  return out;
}

int64_t norm_dim(int64_t d, int64_t n, const char* op) {
  const int64_t i = d < 0 ? d + n : d;
  MT_CHECK(i >= 0 && i < n, op, ": dimension ", d, " out of range for ", n, " dimensions");
  return i;
}

template <typename F>
void binary_loop(const float* a, const float* b, float* o, int64_t n, F f) {
#pragma omp parallel for simd if (n > kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = f(a[i], b[i]);
}

template <typename F>
Tensor binary_impl(const Tensor& a, const Tensor& b, F f) {
  const Shape out_shape = broadcast_shapes(a.shape(), b.shape());
  Tensor out = Tensor::empty(out_shape);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  const int64_t n = out.numel();
  if (a.shape() == b.shape()) {
    binary_loop(pa, pb, po, n, f);
    return out;
  }
  const int64_t na = a.numel(), nb = b.numel();
  // Fast paths: one side a scalar, or one side a trailing block repeated over leading rows.
  if (na == n && nb > 0 && n % nb == 0 &&
      std::equal(b.shape().rbegin(), b.shape().rend(), a.shape().rbegin())) {
    const int64_t rows = n / nb;
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < nb; ++j) po[r * nb + j] = f(pa[r * nb + j], pb[j]);
    return out;
  }
  if (nb == n && na > 0 && n % na == 0 &&
      std::equal(a.shape().rbegin(), a.shape().rend(), b.shape().rbegin())) {
    const int64_t rows = n / na;
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < na; ++j) po[r * na + j] = f(pa[j], pb[r * na + j]);
    return out;
  }
  // General broadcasting via per-dimension strides (0 where broadcast).
  const size_t nd = out_shape.size();
  std::vector<int64_t> sa(nd, 0), sb(nd, 0);
  auto fill_strides = [nd](const Shape& s, std::vector<int64_t>& st) {
    int64_t stride = 1;
    for (size_t k = 0; k < s.size(); ++k) {
      const size_t src = s.size() - 1 - k;
      const size_t dst = nd - 1 - k;
      st[dst] = s[src] == 1 ? 0 : stride;
      stride *= s[src];
    }
  };
  fill_strides(a.shape(), sa);
  fill_strides(b.shape(), sb);
  std::vector<int64_t> idx(nd, 0);
  int64_t oa = 0, ob = 0;
  for (int64_t i = 0; i < n; ++i) {
    po[i] = f(pa[oa], pb[ob]);
    for (size_t k = nd; k-- > 0;) {
      ++idx[k];
      oa += sa[k];
      ob += sb[k];
      if (idx[k] < out_shape[k]) break;
      oa -= sa[k] * out_shape[k];
      ob -= sb[k] * out_shape[k];
      idx[k] = 0;
    }
  }
  return out;
}

}  // namespace

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t nd = std::max(a.size(), b.size());
  Shape out(nd);
  for (size_t k = 0; k < nd; ++k) {
    const int64_t da = k < a.size() ? a[a.size() - 1 - k] : 1;
    const int64_t db = k < b.size() ? b[b.size() - 1 - k] : 1;
    if (da != db && da != 1 && db != 1)
      MT_THROW(ValueError, "shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast");
    out[nd - 1 - k] = da == 1 ? db : da;
  }
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  if (on_device(a) || on_device(b)) [[unlikely]]
    return binary_on_device(op, a, b);
  check_cpu_f32(a, "binary op");
  check_cpu_f32(b, "binary op");
  switch (op) {
    case BinaryOp::add:
      return binary_impl(a, b, [](float x, float y) { return x + y; });
    case BinaryOp::sub:
      return binary_impl(a, b, [](float x, float y) { return x - y; });
    case BinaryOp::mul:
      return binary_impl(a, b, [](float x, float y) { return x * y; });
    case BinaryOp::div:
      return binary_impl(a, b, [](float x, float y) { return x / y; });
  }
  return {};
}

Tensor affine(const Tensor& a, float alpha, float beta) {
  if (on_device(a)) [[unlikely]] {
    DeviceKernels& k = device_f32("affine", {&a});
    MT_CHECK(beta == 0.0f, "affine with an offset is not supported on ", a.device().str(),
             " (only scaling)");
    Tensor out = Tensor::empty(a.shape(), DType::f32, a.device());
    k.scale(a.device(), out.data<float>(), a.data<float>(), alpha, a.numel());
    return out;
  }
  check_cpu_f32(a, "affine");
  Tensor out = Tensor::empty(a.shape());
  const float* p = a.data<float>();
  float* o = out.data<float>();
  const int64_t n = a.numel();
#pragma omp parallel for simd if (n > kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) o[i] = p[i] * alpha + beta;
  return out;
}

Tensor unary(UnaryOp op, const Tensor& a) {
  check_cpu_f32(a, "unary op");
  Tensor out = Tensor::empty(a.shape());
  const float* p = a.data<float>();
  float* o = out.data<float>();
  const int64_t n = a.numel();
  switch (op) {
    case UnaryOp::neg:
      for (int64_t i = 0; i < n; ++i) o[i] = -p[i];
      break;
    case UnaryOp::exp:
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = std::exp(p[i]);
      break;
    case UnaryOp::log:
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = std::log(p[i]);
      break;
    case UnaryOp::tanh:
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = std::tanh(p[i]);
      break;
    case UnaryOp::sqrt:
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = std::sqrt(p[i]);
      break;
    case UnaryOp::abs:
      for (int64_t i = 0; i < n; ++i) o[i] = std::fabs(p[i]);
      break;
  }
  return out;
}

Tensor pow_scalar(const Tensor& a, float exponent) {
  check_cpu_f32(a, "pow");
  Tensor out = Tensor::empty(a.shape());
  const float* p = a.data<float>();
  float* o = out.data<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) o[i] = std::pow(p[i], exponent);
  return out;
}

void add_(Tensor& dst, const Tensor& src) {
  axpy_(dst, 1.0f, src);
}

void scale_(Tensor& dst, float s) {
  if (on_device(dst)) [[unlikely]] {
    device_f32("scale_", {&dst})
        .scale(dst.device(), dst.data<float>(), dst.data<float>(), s, dst.numel());
    return;
  }
  check_cpu_f32(dst, "scale_");
  float* d = dst.data<float>();
  const int64_t n = dst.numel();
#pragma omp parallel for simd if (n > kParallelGrain) schedule(static)
  for (int64_t i = 0; i < n; ++i) d[i] *= s;
}

void scale_each_(const std::vector<Tensor>& ts, float s) {
  std::vector<bool> done(ts.size(), false);
  std::set<const void*> seen;
  for (size_t i = 0; i < ts.size(); ++i) {
    if (!seen.insert(ts[i].data_ptr()).second) done[i] = true;
  }
  for (size_t i = 0; i < ts.size(); ++i) {
    if (done[i] || on_device(ts[i])) continue;
    Tensor t = ts[i];
    scale_(t, s);
    done[i] = true;
  }
  // One call per device, over that device's tensors in list order.
  for (size_t first = 0; first < ts.size(); ++first) {
    if (done[first]) continue;
    const Device d = ts[first].device();
    std::vector<float*> xs;
    std::vector<int64_t> ns;
    for (size_t i = first; i < ts.size(); ++i) {
      if (done[i] || ts[i].device() != d) continue;
      device_f32("scale_", {&ts[i]});
      xs.push_back(ts[i].data<float>());
      ns.push_back(ts[i].numel());
      done[i] = true;
    }
    device_kernels(d, "scale_")
        .scale_many(d, xs.data(), ns.data(), static_cast<int64_t>(xs.size()), s);
  }
}

void axpy_(Tensor& dst, float alpha, const Tensor& src) {
  if (on_device(dst) || on_device(src)) [[unlikely]] {
    DeviceKernels& k = device_f32("axpy_", {&dst, &src});
    MT_CHECK(dst.numel() == src.numel(), "in-place add of ", shape_str(src.shape()), " into ",
             shape_str(dst.shape()));
    k.axpy(dst.device(), dst.data<float>(), src.data<float>(), alpha, dst.numel());
    return;
  }
  check_cpu_f32(dst, "axpy_");
  check_cpu_f32(src, "axpy_");
  MT_CHECK(dst.numel() == src.numel(), "in-place add of ", shape_str(src.shape()), " into ",
           shape_str(dst.shape()));
  float* d = dst.data<float>();
  const float* s = src.data<float>();
  const int64_t n = dst.numel();
  if (alpha == 1.0f) {
#pragma omp parallel for simd if (n > kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
#pragma omp parallel for simd if (n > kParallelGrain) schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] += alpha * s[i];
  }
}

namespace {

// Views a tensor as [outer, size(dim), inner] for reductions over `dim`.
struct Split3 {
  int64_t outer = 1, mid = 1, inner = 1;
};

Split3 split3(const Shape& s, int64_t dim) {
  Split3 r;
  for (int64_t k = 0; k < static_cast<int64_t>(s.size()); ++k) {
    if (k < dim)
      r.outer *= s[static_cast<size_t>(k)];
    else if (k == dim)
      r.mid = s[static_cast<size_t>(k)];
    else
      r.inner *= s[static_cast<size_t>(k)];
  }
  return r;
}

Shape reduced_shape(const Shape& s, int64_t dim, bool keepdim) {
  Shape out = s;
  if (keepdim)
    out[static_cast<size_t>(dim)] = 1;
  else
    out.erase(out.begin() + dim);
  return out;
}

}  // namespace

Tensor sum(const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t d = norm_dim(dim, a.dim(), "sum");
  const Split3 s = split3(a.shape(), d);
  if (on_device(a)) [[unlikely]] {
    DeviceKernels& k = device_f32("sum", {&a});
    Tensor out = Tensor::empty(reduced_shape(a.shape(), d, keepdim), DType::f32, a.device());
    k.sum_dim(a.device(), out.data<float>(), a.data<float>(), s.outer, s.mid, s.inner);
    return out;
  }
  check_cpu_f32(a, "sum");
  Tensor out = Tensor::empty(reduced_shape(a.shape(), d, keepdim));
  cpu::sum_dim(out.data<float>(), a.data<float>(), s.outer, s.mid, s.inner);
  return out;
}

Tensor mean(const Tensor& a, int64_t dim, bool keepdim) {
  const int64_t d = norm_dim(dim, a.dim(), "mean");
  Tensor s = sum(a, d, keepdim);
  scale_(s, 1.0f / static_cast<float>(a.shape()[static_cast<size_t>(d)]));
  return s;
}

std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim) {
  check_cpu_f32(a, "max");
  const int64_t d = norm_dim(dim, a.dim(), "max");
  const Split3 s = split3(a.shape(), d);
  MT_CHECK(s.mid > 0, "max over an empty dimension");
  const Shape rs = reduced_shape(a.shape(), d, keepdim);
  Tensor vals = Tensor::empty(rs);
  Tensor idx = Tensor::empty(rs, DType::i64);
  const float* p = a.data<float>();
  float* v = vals.data<float>();
  int64_t* ix = idx.data<int64_t>();
  for (int64_t i = 0; i < s.outer; ++i) {
    for (int64_t j = 0; j < s.inner; ++j) {
      float best = p[i * s.mid * s.inner + j];
      int64_t bi = 0;
      for (int64_t m = 1; m < s.mid; ++m) {
        const float x = p[(i * s.mid + m) * s.inner + j];
        if (x > best || (std::isnan(x) && !std::isnan(best))) {
          best = x;
          bi = m;
        }
      }
      v[i * s.inner + j] = best;
      ix[i * s.inner + j] = bi;
    }
  }
  return {vals, idx};
}

Tensor sum_all(const Tensor& a) {
  check_cpu_f32(a, "sum_all");
  double acc = 0;
  const float* p = a.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) acc += p[i];
  return Tensor::scalar(static_cast<float>(acc));
}

std::vector<double> sum_squares_each(const std::vector<Tensor>& ts) {
  std::vector<double> out(ts.size(), 0.0);
  std::vector<bool> done(ts.size(), false);
  for (size_t i = 0; i < ts.size(); ++i) {
    if (on_device(ts[i])) continue;
    out[i] = sum_squares(ts[i]);
    done[i] = true;
  }
  // One call per device, over that device's tensors in list order.
  for (size_t first = 0; first < ts.size(); ++first) {
    if (done[first]) continue;
    const Device d = ts[first].device();
    std::vector<size_t> idx;
    std::vector<const float*> xs;
    std::vector<int64_t> ns;
    for (size_t i = first; i < ts.size(); ++i) {
      if (done[i] || ts[i].device() != d) continue;
      device_f32("sum_squares", {&ts[i]});
      idx.push_back(i);
      xs.push_back(ts[i].data<float>());
      ns.push_back(ts[i].numel());
      done[i] = true;
    }
    std::vector<double> sums(idx.size(), 0.0);
    device_kernels(d, "sum_squares")
        .sum_squares_each(d, xs.data(), ns.data(), static_cast<int64_t>(idx.size()), sums.data());
    for (size_t k = 0; k < idx.size(); ++k) out[idx[k]] = sums[k];
  }
  return out;
}

Tensor sum_squares_each_on_device(const std::vector<Tensor>& ts, Device device) {
  MT_CHECK(!device.is_cpu(), "sum_squares_each_on_device: ", device.str(), " is not a device");
  std::vector<const float*> xs;
  std::vector<int64_t> ns;
  for (const Tensor& t : ts) {
    MT_CHECK(t.device() == device, "sum_squares_each_on_device: ", t.str(), " is not on ",
             device.str());
    device_f32("sum_squares", {&t});
    xs.push_back(t.data<float>());
    ns.push_back(t.numel());
  }
  Tensor out = Tensor::empty({static_cast<int64_t>(ts.size() * sizeof(double))}, DType::u8, device);
  if (!ts.empty())
    device_kernels(device, "sum_squares")
        .sum_squares_each_on_device(device, xs.data(), ns.data(), static_cast<int64_t>(ts.size()),
                                    static_cast<double*>(out.data_ptr()));
  return out;
}

double sum_squares(const Tensor& a) {
  if (on_device(a)) [[unlikely]]
    return device_f32("sum_squares", {&a}).sum_squares(a.device(), a.data<float>(), a.numel());
  check_cpu_f32(a, "sum_squares");
  const float* p = a.data<float>();
  const int64_t n = a.numel();
  // Fixed-size blocks summed in a fixed order: the result does not depend on the thread count.
  constexpr int64_t kBlock = 4096;
  const int64_t nblocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(nblocks), 0.0);
#pragma omp parallel for if (n > kParallelGrain) schedule(static)
  for (int64_t b = 0; b < nblocks; ++b) {
    double acc = 0;
    const int64_t end = std::min(n, (b + 1) * kBlock);
    // Lanes of doubles in a fixed pattern: vectorised and still independent of the threads.
#pragma omp simd reduction(+ : acc)
    for (int64_t i = b * kBlock; i < end; ++i) acc += static_cast<double>(p[i]) * p[i];
    partial[static_cast<size_t>(b)] = acc;
  }
  double total = 0;
  for (double x : partial) total += x;
  return total;
}

Tensor sum_to_shape(const Tensor& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  Tensor r = a;
  const int64_t lead = r.dim() - static_cast<int64_t>(shape.size());
  MT_CHECK(lead >= 0, "sum_to_shape: ", shape_str(a.shape()), " cannot reduce to ",
           shape_str(shape));
  for (int64_t k = 0; k < lead; ++k) r = sum(r, 0, false);
  for (size_t k = 0; k < shape.size(); ++k) {
    if (shape[k] == 1 && r.shape()[k] != 1) r = sum(r, static_cast<int64_t>(k), true);
  }
  MT_CHECK(r.shape() == shape, "sum_to_shape: ", shape_str(a.shape()), " cannot reduce to ",
           shape_str(shape));
  return r;
}

Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  DeviceKernels* k = nullptr;
  if (on_device(a) || on_device(b)) [[unlikely]] {
    k = &device_f32("matmul", {&a, &b});
  } else {
    check_cpu_f32(a, "matmul");
    check_cpu_f32(b, "matmul");
  }
  MT_CHECK(a.dim() >= 2 && b.dim() >= 2, "matmul needs at least 2-D operands, got ",
           shape_str(a.shape()), " and ", shape_str(b.shape()));
  const int64_t ar = a.size(-2), ac = a.size(-1), br = b.size(-2), bc = b.size(-1);
  const int64_t M = trans_a ? ac : ar, K = trans_a ? ar : ac;
  const int64_t Kb = trans_b ? bc : br, N = trans_b ? br : bc;
  MT_CHECK(K == Kb, "matmul: inner dimensions differ: ", shape_str(a.shape()), trans_a ? "^T" : "",
           " x ", shape_str(b.shape()), trans_b ? "^T" : "");
  Shape batch(a.shape().begin(), a.shape().end() - 2);
  const Shape bbatch(b.shape().begin(), b.shape().end() - 2);
  MT_CHECK(b.dim() == 2 || bbatch == batch,
           "matmul: batch dimensions differ: ", shape_str(a.shape()), " x ", shape_str(b.shape()));
  const int64_t nb = shape_numel(batch);
  Shape out_shape = batch;
  out_shape.push_back(M);
  out_shape.push_back(N);
  Tensor out = Tensor::empty(out_shape, DType::f32, a.device());
  if (out.numel() == 0) return out;
  if (K == 0) {
    out.zero_();
    return out;
  }
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  const bool shared_b = b.dim() == 2;
  if (k != nullptr) [[unlikely]] {
    if (shared_b && !trans_a) {
      k->matmul(a.device(), po, pa, pb, 1, nb * M, N, K, false, trans_b, 0, 0);
    } else {
      k->matmul(a.device(), po, pa, pb, nb, M, N, K, trans_a, trans_b, ar * ac,
                shared_b ? 0 : br * bc);
    }
    return out;
  }
  if (shared_b && !trans_a) {
    // One large GEMM: fold the batch into rows.
    cpu::gemm(false, trans_b, nb * M, N, K, 1.0f, pa, ac, pb, bc, 0.0f, po, N);
    return out;
  }
  for (int64_t i = 0; i < nb; ++i) {
    cpu::gemm(trans_a, trans_b, M, N, K, 1.0f, pa + i * ar * ac, ac,
              pb + (shared_b ? 0 : i * br * bc), bc, 0.0f, po + i * M * N, N);
  }
  return out;
}

Tensor permute(const Tensor& a, const std::vector<int64_t>& dims) {
  MT_CHECK(a.device().is_cpu(), "permute is not supported on ", a.device().str(),
           " (it runs on the CPU only)");
  const int64_t nd = a.dim();
  MT_CHECK(static_cast<int64_t>(dims.size()) == nd, "permute: ", dims.size(), " dims for a ", nd,
           "-d tensor");
  std::vector<int64_t> perm(dims.size());
  std::vector<bool> seen(dims.size(), false);
  for (size_t k = 0; k < dims.size(); ++k) {
    perm[k] = norm_dim(dims[k], nd, "permute");
    MT_CHECK(!seen[static_cast<size_t>(perm[k])], "permute: repeated dimension");
    seen[static_cast<size_t>(perm[k])] = true;
  }
  Shape out_shape(dims.size());
  std::vector<int64_t> in_strides(dims.size());
  int64_t st = 1;
  for (int64_t k = nd - 1; k >= 0; --k) {
    in_strides[static_cast<size_t>(k)] = st;
    st *= a.shape()[static_cast<size_t>(k)];
  }
  std::vector<int64_t> src_stride(dims.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    out_shape[k] = a.shape()[static_cast<size_t>(perm[k])];
    src_stride[k] = in_strides[static_cast<size_t>(perm[k])];
  }
  Tensor out = Tensor::empty(out_shape, a.dtype());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const size_t esz = dtype_size(a.dtype());
  const char* src = static_cast<const char*>(a.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  std::vector<int64_t> idx(dims.size(), 0);
  int64_t off = 0;
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * esz, src + off * esz, esz);
    for (size_t k = dims.size(); k-- > 0;) {
      ++idx[k];
      off += src_stride[k];
      if (idx[k] < out_shape[k]) break;
      off -= src_stride[k] * out_shape[k];
      idx[k] = 0;
    }
  }
  return out;
}

Tensor transpose(const Tensor& a, int64_t d0, int64_t d1) {
  std::vector<int64_t> dims(static_cast<size_t>(a.dim()));
  for (size_t k = 0; k < dims.size(); ++k) dims[k] = static_cast<int64_t>(k);
  std::swap(dims[static_cast<size_t>(norm_dim(d0, a.dim(), "transpose"))],
            dims[static_cast<size_t>(norm_dim(d1, a.dim(), "transpose"))]);
  return permute(a, dims);
}

Tensor cat(const std::vector<Tensor>& parts, int64_t dim) {
  MT_CHECK(!parts.empty(), "cat of no tensors");
  const int64_t d = norm_dim(dim, parts[0].dim(), "cat");
  Shape out_shape = parts[0].shape();
  out_shape[static_cast<size_t>(d)] = 0;
  for (const Tensor& p : parts) {
    MT_CHECK(p.dim() == parts[0].dim() && p.dtype() == parts[0].dtype(), "cat: mismatched parts");
    MT_CHECK(p.device() == parts[0].device(), "cat: parts on ", parts[0].device().str(), " and ",
             p.device().str());
    for (int64_t k = 0; k < p.dim(); ++k)
      MT_CHECK(
          k == d || p.shape()[static_cast<size_t>(k)] == parts[0].shape()[static_cast<size_t>(k)],
          "cat: shapes ", shape_str(p.shape()), " and ", shape_str(parts[0].shape()),
          " differ outside dimension ", d);
    out_shape[static_cast<size_t>(d)] += p.shape()[static_cast<size_t>(d)];
  }
  const Device device = parts[0].device();
  Tensor out = Tensor::empty(out_shape, parts[0].dtype(), device);
  const Split3 so = split3(out_shape, d);
  const size_t esz = dtype_size(out.dtype());
  char* dst = static_cast<char*>(out.data_ptr());
  int64_t col = 0;
  for (const Tensor& p : parts) {
    const int64_t w = p.shape()[static_cast<size_t>(d)] * so.inner;
    const char* src = static_cast<const char*>(p.data_ptr());
    if (on_device(p)) {
      allocator_for(device.type)
          .copy_2d(dst + col * esz, static_cast<size_t>(so.mid * so.inner) * esz, device, src,
                   static_cast<size_t>(w) * esz, device, static_cast<size_t>(w) * esz,
                   static_cast<size_t>(so.outer));
    } else {
      for (int64_t i = 0; i < so.outer; ++i)
        std::memcpy(dst + (i * so.mid * so.inner + col) * esz, src + i * w * esz,
                    static_cast<size_t>(w) * esz);
    }
    col += w;
  }
  return out;
}

Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length) {
  MT_CHECK(a.defined(), "narrow: undefined tensor");
  const int64_t d = norm_dim(dim, a.dim(), "narrow");
  const int64_t size = a.shape()[static_cast<size_t>(d)];
  MT_CHECK(start >= 0 && length >= 0 && start + length <= size, "narrow: [", start, ", ",
           start + length, ") out of range for size ", size);
  const Split3 s = split3(a.shape(), d);
  Shape out_shape = a.shape();
  out_shape[static_cast<size_t>(d)] = length;
  Tensor out = Tensor::empty(out_shape, a.dtype(), a.device());
  const size_t esz = dtype_size(a.dtype());
  const char* src = static_cast<const char*>(a.data_ptr());
  char* dst = static_cast<char*>(out.data_ptr());
  const int64_t w = length * s.inner;
  if (on_device(a)) {
    allocator_for(a.device().type)
        .copy_2d(dst, static_cast<size_t>(w) * esz, a.device(), src + start * s.inner * esz,
                 static_cast<size_t>(s.mid * s.inner) * esz, a.device(),
                 static_cast<size_t>(w) * esz, static_cast<size_t>(s.outer));
    return out;
  }
  for (int64_t i = 0; i < s.outer; ++i)
    std::memcpy(dst + i * w * esz, src + (i * s.mid * s.inner + start * s.inner) * esz,
                static_cast<size_t>(w) * esz);
  return out;
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::fabs(static_cast<double>(va[i]) - vb[i]) >
        atol + rtol * std::fabs(static_cast<double>(vb[i])))
      return false;
  }
  return true;
}

bool equal(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  if (!a.device().is_cpu() || !b.device().is_cpu())
    return equal(a.to(Device::cpu()), b.to(Device::cpu()));
  return a.nbytes() == 0 || std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()) == 0;
}

}  // namespace meshtrain::ops
