// Device-dispatched tensor operations without autograd. The autograd layer builds its
// differentiable ops from these; the fused per-layer kernels (layer norm, attention,
// cross-entropy, ...) live in tensor/cpu/ and are called from the autograd layer directly.
// Every op here has a CPU implementation; the CPU result is the reference for other devices.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ops {

enum class BinaryOp : uint8_t { add, sub, mul, div };
enum class UnaryOp : uint8_t { neg, exp, log, tanh, sqrt, abs };

// Shape that two shapes broadcast to (numpy rules); throws ValueError naming both shapes.
Shape broadcast_shapes(const Shape& a, const Shape& b);

// Elementwise a (op) b with broadcasting; f32. On a device: equal shapes, or an addition of a
// row repeated over the leading dimensions (a bias, a position table).
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
inline Tensor add(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::add, a, b);
}
inline Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::sub, a, b);
}
inline Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::mul, a, b);
}
inline Tensor div(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::div, a, b);
}
// a * alpha + beta, elementwise.
Tensor affine(const Tensor& a, float alpha, float beta);
Tensor unary(UnaryOp op, const Tensor& a);
Tensor pow_scalar(const Tensor& a, float exponent);

// In place: dst += src (same number of elements), dst *= s, dst += alpha * src.
void add_(Tensor& dst, const Tensor& src);
void scale_(Tensor& dst, float s);
// scale_ of every tensor (f32, contiguous), each with scale_'s bits; the tensors of one device in
// one call (a gradient clip or unscale over hundreds of parameters: not a launch each). A tensor
// listed twice (one gradient held by two entries) is scaled once: the arrays of one call must not
// overlap, and scaling twice would be wrong anyway.
void scale_each_(const std::vector<Tensor>& ts, float s);
void axpy_(Tensor& dst, float alpha, const Tensor& src);

// Reductions over one dimension (negative counts from the end); sum and mean run on a device too,
// with the CPU's bits.
Tensor sum(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor mean(const Tensor& a, int64_t dim, bool keepdim = false);
// Max values and their first index (i64) along dim.
std::pair<Tensor, Tensor> max(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor sum_all(const Tensor& a);      // 0-d, summed in double
double sum_squares(const Tensor& a);  // in double; deterministic across thread counts
// sum_squares of each tensor, with the same bits; the tensors on a device are summed with one wait
// for that device instead of one per tensor.
std::vector<double> sum_squares_each(const std::vector<Tensor>& ts);
// The same sums for tensors on `device` (not the CPU), left there: a buffer of ts.size() doubles
// (u8, eight bytes each) on the device, filled without a wait.
Tensor sum_squares_each_on_device(const std::vector<Tensor>& ts, Device device);
// Sums a broadcast result back to `shape` (the gradient of broadcasting).
Tensor sum_to_shape(const Tensor& a, const Shape& shape);

// Matrix products on the last two dimensions; leading dimensions are batch dimensions and must
// match, or b may be 2-D (shared by every batch). trans_* transposes that operand's last two dims.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);

// Contiguous copies with dimensions reordered.
Tensor transpose(const Tensor& a, int64_t d0, int64_t d1);
Tensor permute(const Tensor& a, const std::vector<int64_t>& dims);

// Concatenation and splitting along dim 0..n-1: copies, of any dtype, on the CPU or within one
// device (a strided copy per part there, no kernel).
Tensor cat(const std::vector<Tensor>& parts, int64_t dim);
// The [start, start + length) range of dimension `dim` (a copy).
Tensor narrow(const Tensor& a, int64_t dim, int64_t start, int64_t length);

bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);
bool equal(const Tensor& a, const Tensor& b);  // same shape, dtype and bits

}  // namespace meshtrain::ops
