// Edge cases of the device casts and GELU against their host references: rounding ties,
// subnormals and overflow of the narrowing casts (bit for bit, a NaN only needing to stay a NaN),
// every 16-bit pattern through the widening and cross-half casts, and GELU on signed zeros,
// subnormals, infinities, NaN and saturated inputs, on the four-wide kernels and on the one-wide
// ones that odd lengths and misaligned arrays take. Skipped, with the reason, without a device.
#include <gtest/gtest.h>

#include "tests/support/capability.h"

#if MESHTRAIN_HAVE_CUDA

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/cuda/kernels/cast.h"
#include "meshtrain/cuda/kernels/gelu.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/dtype.h"
#include "meshtrain/tensor/tensor.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/device_vectors.h"

namespace meshtrain {
namespace {

using test::all_close;
using test::kDev;
using test::random_floats;
using test::stream;

class CudaCastGeluEdges : public test::DeviceKernelTest {};

constexpr float kInf = std::numeric_limits<float>::infinity();

float from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}

// How an array reaches a kernel: its length and how many elements past an aligned allocation it
// starts. One element off puts it off the 16-byte alignment the four-wide kernels need, and a
// length that is not a multiple of four sends every array to the one-wide kernel.
struct Layout {
  int64_t n;
  int64_t offset;
};

std::string describe(const Layout& l) {
  return "n " + std::to_string(l.n) + " offset " + std::to_string(l.offset);
}

// The layouts every kernel below runs with for an input of n elements (n a multiple of four).
std::vector<Layout> layouts(int64_t n) {
  return {{n, 0}, {n - 1, 0}, {n, 1}};
}

Tensor dev_array(int64_t n, DType type, int64_t offset) {
  return Tensor::empty({n + offset}, type, kDev).slice(offset, offset + n);
}

// The first n elements of a host tensor, on the device at `offset`.
Tensor dev_copy(const Tensor& host, int64_t n, int64_t offset) {
  Tensor d = dev_array(n, host.dtype(), offset);
  d.copy_(host.slice(0, n));
  return d;
}

Tensor host_floats(const std::vector<float>& v) {
  return Tensor::from_vector(v, {static_cast<int64_t>(v.size())});
}

Tensor host_halves(const std::vector<uint16_t>& bits, DType type) {
  Tensor h = Tensor::empty({static_cast<int64_t>(bits.size())}, type);
  std::memcpy(h.data_ptr(), bits.data(), bits.size() * sizeof(uint16_t));
  return h;
}

// The host's conversion of a host tensor's first n elements: the reference of every cast.
Tensor host_convert(const Tensor& src, int64_t n, DType type) {
  Tensor out = Tensor::empty({n}, type);
  convert(src.data_ptr(), src.dtype(), out.data_ptr(), type, static_cast<size_t>(n));
  return out;
}

uint32_t bits_at(const Tensor& host, int64_t i) {
  if (host.dtype() == DType::f32)
    return std::bit_cast<uint32_t>(static_cast<const float*>(host.data_ptr())[i]);
  return static_cast<const uint16_t*>(host.data_ptr())[i];
}

bool is_nan_bits(uint32_t b, DType type) {
  if (type == DType::f32) return (b & 0x7fffffffu) > 0x7f800000u;
  if (type == DType::bf16) return (b & 0x7fffu) > 0x7f80u;
  return (b & 0x7fffu) > 0x7c00u;
}

// Every element's bits equal (signed zeros and infinities included), except that where the
// reference is a NaN the result only has to be one: the device's conversions give a canonical
// NaN where the host keeps the sign (and, for bf16, part of the payload).
::testing::AssertionResult same_bits(const Tensor& got_any, const Tensor& want) {
  const Tensor got = got_any.to(Device::cpu());
  if (got.dtype() != want.dtype() || got.numel() != want.numel())
    return ::testing::AssertionFailure() << "shapes or dtypes differ";
  const DType t = want.dtype();
  int64_t bad = 0, first = -1;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const uint32_t g = bits_at(got, i), w = bits_at(want, i);
    const bool ok = is_nan_bits(w, t) ? is_nan_bits(g, t) : g == w;
    if (!ok && bad++ == 0) first = i;
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << want.numel() << " " << dtype_name(t) << " elements differ; first at "
         << first << ": got 0x" << std::hex << bits_at(got, first) << ", want 0x"
         << bits_at(want, first);
}

// f32 inputs at the rounding boundaries of both half types, then every f32 whose low 16 bits
// sit at a boundary for some exponent (ties to even with an even and an odd kept bit, one unit
// either side) under every sign, exponent and high mantissa, NaN patterns included.
std::vector<float> narrowing_inputs() {
  std::vector<uint32_t> b = {
      0x00000000, 0x80000000, 0x7f800000, 0xff800000,  // signed zeros, infinities
      0x00000001, 0x80000001, 0x007fffff, 0x807fffff,  // f32 subnormals: f16 zeros of their sign
      0x00008000, 0x00018000, 0x00008001,              // ties between bf16 subnormals
      0x33000000, 0xb3000000, 0x33000001, 0x32ffffff,  // half of f16's smallest subnormal
      0x33800000, 0x33c00000, 0x34200000, 0x34600000,  // f16 subnormals 1, 1.5, 2.5, 3.5 (ulps)
      0x387fc000, 0x387fdfff, 0x387fe000, 0xb87fe000,  // largest f16 subnormal; tie to the normal
      0x3f801000, 0x3f803000, 0x3f808000, 0x3f818000,  // normal ties of f16 and of bf16
      0x477fe000, 0x477fefff, 0x477ff000, 0xc77ff000,  // 65504; just under 65520; 65520 -> inf
      0x47800000, 0x7f7f7fff, 0x7f7f8000, 0x7f7fffff,  // bf16's overflow boundary, FLT_MAX
      0xff7fffff, 0x7fc00000, 0xffc00000, 0x7f800001,  // quiet and signalling NaNs, payloads
      0x7fa5a5a5, 0xff812345, 0x7fffffff, 0xffffffff};
  for (uint32_t hi = 0; hi < 0x10000u; ++hi)
    for (uint32_t lo :
         {0x0000u, 0x0001u, 0x0fffu, 0x1000u, 0x1001u, 0x3000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu})
      b.push_back(hi << 16 | lo);
  while (b.size() % 4 != 0) b.push_back(0x3f800000u);
  std::vector<float> v;
  v.reserve(b.size());
  for (uint32_t u : b) v.push_back(from_bits(u));
  return v;
}

// The host's NaN handling is the one difference a cast may show, so it must be NaN exactly for
// NaN inputs: then same_bits tolerates nothing else.
void expect_nan_only_for_nan(const Tensor& in, const Tensor& out) {
  for (int64_t i = 0; i < in.numel(); ++i)
    ASSERT_EQ(is_nan_bits(bits_at(in, i), in.dtype()), is_nan_bits(bits_at(out, i), out.dtype()))
        << "element " << i;
}

TEST_F(CudaCastGeluEdges, NarrowingCastsMatchTheHostBitForBitOnTiesSubnormalsAndOverflow) {
  const Tensor in = host_floats(narrowing_inputs());
  const int64_t n = in.numel();
  for (DType t : {DType::bf16, DType::f16}) {
    const Tensor want = host_convert(in, n, t);
    expect_nan_only_for_nan(in, want);
    // The four-wide f32 -> bf16 kernel needs n a multiple of four, a 16-byte aligned source and
    // an 8-byte aligned destination: each of these misses exactly one of them (or none).
    struct CastLayout {
      int64_t n, src_offset, dst_offset;
    };
    for (const CastLayout& c :
         std::vector<CastLayout>{{n, 0, 0}, {n - 1, 0, 0}, {n, 1, 0}, {n, 0, 1}}) {
      SCOPED_TRACE(std::string(dtype_name(t)) + " n " + std::to_string(c.n) + " offsets " +
                   std::to_string(c.src_offset) + "," + std::to_string(c.dst_offset));
      const Tensor src = dev_copy(in, c.n, c.src_offset);
      const Tensor dst = dev_array(c.n, t, c.dst_offset);
      if (c.src_offset == 0 && c.dst_offset == 0) {
        ASSERT_EQ(reinterpret_cast<uintptr_t>(src.data_ptr()) % 16, 0u) << "not the vector path";
        ASSERT_EQ(reinterpret_cast<uintptr_t>(dst.data_ptr()) % 8, 0u) << "not the vector path";
      }
      cuda::cast(dst.data_ptr(), t, src.data_ptr(), DType::f32, c.n, stream());
      EXPECT_TRUE(same_bits(dst, want.slice(0, c.n)));
    }
  }
}

// Widening is exact and a cast between the half types rounds once (through an exact f32), so
// every one of the 65536 patterns of each type must come out as the host converts it: the
// subnormal halves above all, which widen to f32 normals.
TEST_F(CudaCastGeluEdges, WideningAndCrossHalfCastsAreExactForEverySixteenBitPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t i = 0; i < all.size(); ++i) all[i] = static_cast<uint16_t>(i);
  for (DType src_type : {DType::bf16, DType::f16}) {
    const Tensor in = host_halves(all, src_type);
    const DType other = src_type == DType::bf16 ? DType::f16 : DType::bf16;
    for (DType dst_type : {DType::f32, other}) {
      const Tensor want = host_convert(in, in.numel(), dst_type);
      expect_nan_only_for_nan(in, want);
      for (const Layout& l : layouts(in.numel())) {
        SCOPED_TRACE(std::string(dtype_name(src_type)) + " -> " +
                     std::string(dtype_name(dst_type)) + " " + describe(l));
        const Tensor src = dev_copy(in, l.n, l.offset);
        const Tensor dst = dev_array(l.n, dst_type, l.offset);
        cuda::cast(dst.data_ptr(), dst_type, src.data_ptr(), src_type, l.n, stream());
        EXPECT_TRUE(same_bits(dst, want.slice(0, l.n)));
      }
    }
  }
}

// Where GELU's factor 0.5 * (1 + tanh(u)) is exactly 1/2 (u zero or subnormal: the exponential is
// exactly one on both sides, the device's exp2 flushing a subnormal argument to zero) or exactly 1
// (x above 4.9: exp(-2u) below half an ulp of 1), the device's reciprocal-and-product and the
// host's quotient are both exact: the same bits, the sign of zero included, up to FLT_MAX and
// infinity, in f32 and through each half output.
TEST_F(CudaCastGeluEdges, GeluIsExactWhereItsFactorIsOneHalfOrOne) {
  const float tiny = std::numeric_limits<float>::denorm_min();
  std::vector<float> x = {0.0f,     -0.0f,    tiny,  -tiny,   3 * tiny, -3 * tiny,
                          1e-40f,   -1e-40f,  6.0f,  7.5f,    100.0f,   65504.0f,
                          65520.0f, 70000.0f, 1e20f, 3.0e38f, kInf,     from_bits(0x7f7fffffu)};
  while (x.size() % 4 != 0) x.push_back(50.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(x.size());
  cpu::gelu_forward(y.data(), x.data(), n);
  const Tensor in = host_floats(x), want = host_floats(y);
  for (const Layout& l : layouts(n)) {
    SCOPED_TRACE(describe(l));
    const Tensor gx = dev_copy(in, l.n, l.offset);
    const Tensor gy = dev_array(l.n, DType::f32, l.offset);
    cuda::gelu_forward(gy.data_ptr(), DType::f32, gx.data_ptr(), DType::f32, l.n, stream());
    EXPECT_TRUE(same_bits(gy, want.slice(0, l.n)));
    // A half output is that value rounded once: -0 stays -0, 65520 and above overflow f16.
    for (DType half : {DType::bf16, DType::f16}) {
      const Tensor hy = dev_array(l.n, half, l.offset);
      cuda::gelu_forward(hy.data_ptr(), half, gx.data_ptr(), DType::f32, l.n, stream());
      EXPECT_TRUE(same_bits(hy, host_convert(want, l.n, half))) << dtype_name(half);
    }
  }
}

// GELU's special inputs next to random ones over [-12, 12], where the exponent -2u reaches its
// clamp (x below about -10.05). A host built to fuse x + c x^3 into one multiply-add, as nvcc
// does, computes the same u and differs in exp (the device's expf against a polynomial, each
// within 2 ulp), in 1 + e (fused on the device) and in the reciprocal-then-product: a few ulps.
// But the relative error of exp(-2u) is |2u| times that of u, up to 88.7 times: a host build
// without FMA instructions is about 70 ulps apart for x near -9, hence 2e-5. The
// backward's s + 2x s (1 - s) du cancels near its zero (x = -0.75): an absolute 2e-6 for output
// gradients within [-1, 1]. NaN and infinities must come out where the host gives them, and the
// four-wide and one-wide kernels must agree bit for bit.
TEST_F(CudaCastGeluEdges, GeluMatchesTheCpuOnNonFiniteAndSaturatedInputsOnEveryPath) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> x = {nan,   -nan,   kInf,   -kInf,   1e20f,  -1e20f,  5e19f,
                          6e19f, -3e38f, 3e38f,  -10.0f,  -20.0f, -10.05f, -0.7518f,
                          -0.0f, 0.0f,   1e-30f, -1e-30f, 88.0f,  -88.0f};
  const auto r = random_floats(4096, 901, -12.0f, 12.0f);
  x.insert(x.end(), r.begin(), r.end());
  while (x.size() % 4 != 0) x.push_back(1.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  const auto dout = random_floats(x.size(), 902);
  std::vector<float> y(x.size()), dx(x.size());
  cpu::gelu_forward(y.data(), x.data(), n);
  cpu::gelu_backward(dx.data(), x.data(), dout.data(), n);
  const Tensor in = host_floats(x), g = host_floats(dout);
  Tensor y4, dx4;  // the four-wide kernels' results, layouts(n) starting with the aligned one
  for (const Layout& l : layouts(n)) {
    SCOPED_TRACE(describe(l));
    const Tensor gx = dev_copy(in, l.n, l.offset), gg = dev_copy(g, l.n, l.offset);
    Tensor gy = dev_array(l.n, DType::f32, l.offset), gdx = dev_array(l.n, DType::f32, l.offset);
    cuda::gelu_forward(gy.data_ptr(), DType::f32, gx.data_ptr(), DType::f32, l.n, stream());
    cuda::gelu_backward(gdx.data_ptr(), DType::f32, gx.data_ptr(), DType::f32, gg.data_ptr(),
                        DType::f32, l.n, stream());
    const auto got_y = gy.to(Device::cpu()).to_vector();
    const auto got_dx = gdx.to(Device::cpu()).to_vector();
    const auto len = static_cast<size_t>(l.n);
    EXPECT_TRUE(all_close(got_y, std::vector<float>(y.begin(), y.begin() + len), 2e-5, 0.0));
    EXPECT_TRUE(all_close(got_dx, std::vector<float>(dx.begin(), dx.begin() + len), 2e-5, 2e-6));
    for (size_t i = 0; i < len; ++i) {  // all_close does not see the sign of a zero
      if (y[i] == 0.0f) {
        EXPECT_EQ(std::signbit(got_y[i]), std::signbit(y[i])) << "x " << x[i];
      }
    }
    if (l.n == n && l.offset == 0) {
      y4 = gy.to(Device::cpu());
      dx4 = gdx.to(Device::cpu());
    } else {
      EXPECT_TRUE(same_bits(gy, y4.slice(0, l.n))) << "one-wide forward vs four-wide";
      EXPECT_TRUE(same_bits(gdx, dx4.slice(0, l.n))) << "one-wide backward vs four-wide";
    }
  }
}

// Autocast's half activations on the one-wide kernels: half inputs, outputs and gradients are
// widened exactly and rounded once, so each result is the f32 kernel's on the widened values,
// rounded by the host's conversion (which the device's matches bit for bit). The inputs include
// each half type's extremes, its infinities, a NaN and -0.
TEST_F(CudaCastGeluEdges, GeluOnHalfArraysRoundsTheF32ResultOnceOnEveryPath) {
  for (DType half : {DType::bf16, DType::f16}) {
    const float big = half == DType::f16 ? 65504.0f : from_bits(0x7f7f0000u);
    std::vector<float> x = {-0.0f,         0.0f,  big,    -big,  kInf, -kInf,
                            std::nanf(""), 6e-8f, -6e-8f, -9.0f, 9.0f, -0.75f};
    const auto r = random_floats(2048, 903, -10.0f, 10.0f);
    x.insert(x.end(), r.begin(), r.end());
    while (x.size() % 4 != 0) x.push_back(-1.0f);
    const int64_t n = static_cast<int64_t>(x.size());
    const Tensor hx = host_floats(x).to(half);
    const Tensor hg = host_floats(random_floats(x.size(), 904)).to(half);
    const Tensor fx = hx.to(DType::f32), fg = hg.to(DType::f32);
    // The reference: the four-wide f32 kernels on the widened values.
    const Tensor rx = dev_copy(fx, n, 0), rg = dev_copy(fg, n, 0);
    Tensor ry = dev_array(n, DType::f32, 0), rdx = dev_array(n, DType::f32, 0);
    cuda::gelu_forward(ry.data_ptr(), DType::f32, rx.data_ptr(), DType::f32, n, stream());
    cuda::gelu_backward(rdx.data_ptr(), DType::f32, rx.data_ptr(), DType::f32, rg.data_ptr(),
                        DType::f32, n, stream());
    const Tensor ref_y = ry.to(Device::cpu()), ref_dx = rdx.to(Device::cpu());
    for (const Layout& l : layouts(n)) {
      SCOPED_TRACE(std::string(dtype_name(half)) + " " + describe(l));
      const Tensor want_y = ref_y.slice(0, l.n), want_dx = ref_dx.slice(0, l.n);
      const Tensor gx = dev_copy(hx, l.n, l.offset), gg = dev_copy(hg, l.n, l.offset);
      Tensor y = dev_array(l.n, half, l.offset), yf = dev_array(l.n, DType::f32, l.offset);
      cuda::gelu_forward(y.data_ptr(), half, gx.data_ptr(), half, l.n, stream());
      cuda::gelu_forward(yf.data_ptr(), DType::f32, gx.data_ptr(), half, l.n, stream());
      EXPECT_TRUE(same_bits(y, host_convert(want_y, l.n, half))) << "half -> half";
      EXPECT_TRUE(same_bits(yf, want_y)) << "half -> f32";
      // A half gradient of a half input, and an f32 gradient into a half one (a product's
      // epilogue on the rounded pre-activation).
      Tensor dx = dev_array(l.n, half, l.offset);
      cuda::gelu_backward(dx.data_ptr(), half, gx.data_ptr(), half, gg.data_ptr(), half, l.n,
                          stream());
      EXPECT_TRUE(same_bits(dx, host_convert(want_dx, l.n, half))) << "half gradients";
      const Tensor gf = dev_copy(fg, l.n, l.offset);
      cuda::gelu_backward(dx.data_ptr(), half, gx.data_ptr(), half, gf.data_ptr(), DType::f32, l.n,
                          stream());
      EXPECT_TRUE(same_bits(dx, host_convert(want_dx, l.n, half))) << "f32 output gradient";
    }
  }
}

// The two one-pass forwards of an f32 input: both keep the input rounded to the half type (as a
// cast rounds it: 65520 and above become f16 infinities, NaN stays NaN), one takes GELU of that
// copy, the other of the f32 input itself (a product's epilogue), whose f32 result may exceed
// the half range. Each must equal gelu_forward of its own operand, bit for bit, on every path.
TEST_F(CudaCastGeluEdges, GeluForwardKeepAndHalfDifferOnlyInTheOperandTheyTake) {
  for (DType half : {DType::bf16, DType::f16}) {
    std::vector<float> x = {65519.0f, 65520.0f, 1e5f,  -1e5f, std::nanf(""), -0.0f,
                            kInf,     -kInf,    1e-7f, 3e-8f, -8.8f,         0.3f};
    const auto r = random_floats(1024, 905, -7.0f, 7.0f);
    x.insert(x.end(), r.begin(), r.end());
    while (x.size() % 4 != 0) x.push_back(2.0f);
    const int64_t n = static_cast<int64_t>(x.size());
    const Tensor in = host_floats(x);
    const Tensor copy_want = host_convert(in, n, half);
    // The references: the plain four-wide kernel on the input and on its rounded copy.
    Tensor of_input = dev_array(n, DType::f32, 0), of_copy = dev_array(n, DType::f32, 0);
    const Tensor ax = dev_copy(in, n, 0), ar = dev_copy(copy_want.to(DType::f32), n, 0);
    cuda::gelu_forward(of_input.data_ptr(), DType::f32, ax.data_ptr(), DType::f32, n, stream());
    cuda::gelu_forward(of_copy.data_ptr(), DType::f32, ar.data_ptr(), DType::f32, n, stream());
    const Tensor want_keep = of_input.to(Device::cpu()), want_half = of_copy.to(Device::cpu());
    for (const Layout& l : layouts(n)) {
      SCOPED_TRACE(std::string(dtype_name(half)) + " " + describe(l));
      const Tensor gx = dev_copy(in, l.n, l.offset);
      for (DType out_type : {DType::f32, half}) {
        SCOPED_TRACE(std::string("out ") + std::string(dtype_name(out_type)));
        Tensor out = dev_array(l.n, out_type, l.offset), copy = dev_array(l.n, half, l.offset);
        cuda::gelu_forward_keep(out.data_ptr(), out_type, copy.data_ptr(),
                                static_cast<const float*>(gx.data_ptr()), half, l.n, stream());
        EXPECT_TRUE(same_bits(copy, copy_want.slice(0, l.n))) << "keep's copy";
        EXPECT_TRUE(same_bits(out, host_convert(want_keep, l.n, out_type))) << "keep";
        cuda::gelu_forward_half(out.data_ptr(), out_type, copy.data_ptr(),
                                static_cast<const float*>(gx.data_ptr()), half, l.n, stream());
        EXPECT_TRUE(same_bits(copy, copy_want.slice(0, l.n))) << "half's copy";
        EXPECT_TRUE(same_bits(out, host_convert(want_half, l.n, out_type))) << "half";
      }
    }
  }
}

}  // namespace
}  // namespace meshtrain

#endif  // MESHTRAIN_HAVE_CUDA
