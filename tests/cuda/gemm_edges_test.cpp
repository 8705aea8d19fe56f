// The device products at the edges where cuBLASLt's epilogues may refuse and the product takes
// its way round (widths and depths that are not multiples of 8, operands at odd element offsets,
// a single row or column, GELU without a bias, f16 as well as bf16, TF32 on and off), through the
// kernel table entries autograd calls, against the CPU reference on the same inputs. Most inputs
// are small multiples of a power of two, so that every product and partial sum is exact in f32
// whatever the order: where the contract is "the f32 sum, rounded once", the device must then give
// the CPU's bits, fused or not. Only GELU's own formula (cuBLASLt's is not ours) gets a tolerance.
#include <gtest/gtest.h>

#include "tests/support/capability.h"

#if MESHTRAIN_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/kernels/gemm.h"
#include "meshtrain/tensor/cpu/kernels.h"
#include "meshtrain/tensor/device_kernels.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/device_vectors.h"

namespace meshtrain {
namespace {

using test::kDev;
using test::random_floats;
using test::random_ints;
using test::rounded;
using test::up;

class CudaGemmEdges : public test::DeviceKernelTest {};

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Numerators in [-range, range] over `denom` (a power of two): exact in bf16 and f16 for
// range <= 8, and products and sums of a few hundred of them stay far inside f32's 24 bits.
std::vector<float> dyadic(size_t n, uint64_t seed, int32_t range, float denom) {
  const std::vector<int32_t> ints = random_ints(n, seed, -range, range);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(ints[i]) / denom;
  return v;
}

// An array on the device `lead` elements into its buffer: lead 1 puts it at an odd element offset
// (2-byte aligned for the half types, 4-byte for f32), as a view into a larger storage can be,
// where cuBLASLt has fewer kernels and its epilogues may have none. The lead elements hold NaN,
// so that a write outside the array shows.
struct Placed {
  Tensor buf;
  int64_t lead = 0;
  void* ptr() const {
    return static_cast<char*>(buf.data_ptr()) +
           lead * static_cast<int64_t>(dtype_size(buf.dtype()));
  }
  float* fptr() const { return static_cast<float*>(ptr()); }
  std::vector<float> all() const { return buf.to(DType::f32).to_vector(); }
  std::vector<float> values() const {
    const std::vector<float> a = all();
    return {a.begin() + lead, a.end()};
  }
  bool guard_intact() const {
    const std::vector<float> a = all();
    for (int64_t i = 0; i < lead; ++i)
      if (!std::isnan(a[static_cast<size_t>(i)])) return false;
    return true;
  }
};

Placed place(const std::vector<float>& v, DType t, int64_t lead) {
  std::vector<float> padded(static_cast<size_t>(lead), kNaN);
  padded.insert(padded.end(), v.begin(), v.end());
  return {up(padded).to(t), lead};
}

Placed place_nan(int64_t n, DType t, int64_t lead) {
  return place(std::vector<float>(static_cast<size_t>(n), kNaN), t, lead);
}

// One ulp of `t` relative to the value it is next to, at most (2^-7 for bf16, 2^-10 for f16).
double half_step(DType t) {
  return t == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
}

struct Dims {
  int64_t bt, cin, cout;
};

std::string describe(DType t, const Dims& d, int64_t lead, bool fused) {
  return std::string(dtype_name(t)) + " BT=" + std::to_string(d.bt) +
         " C_in=" + std::to_string(d.cin) + " C_out=" + std::to_string(d.cout) +
         " lead=" + std::to_string(lead) + (fused ? " fused" : " separate");
}

// Shapes on both sides of what cuBLASLt's epilogues want: widths and depths not multiples of 8
// (GELU's aux leading dimension must be), a single row or output column, and one aligned shape
// where the fused form should run.
const std::vector<Dims> kDims = {{33, 29, 37}, {1, 16, 24}, {9, 8, 1}, {64, 64, 72}};

// GELU where the first product writes, with and without a bias (GELU_AUX and GELU_AUX_BIAS), in
// f16 and bf16, fused or not: pre is the exact sum rounded once (the CPU's bits), out GELU of the
// unrounded sum. cuBLASLt's tanh may be an approximation (about 2^-11 relative), which moves
// 0.5 * x * (1 + tanh) by up to ~2^-12 |x|: hence 1e-3 (1 + |x|) beside two output steps.
TEST_F(CudaGemmEdges, GeluEpilogueWithoutBiasAtOddWidthsKeepsTheCpusRoundedInput) {
  const test::ProductSwitches restore;
  DeviceKernels& k = *cuda::kernel_table();
  uint64_t seed = 100;
  for (const DType half : {DType::f16, DType::bf16}) {
    for (const Dims& d : kDims) {
      for (const bool with_bias : {false, true}) {
        for (const int64_t lead : {0, 1}) {
          for (const bool fused : {true, false}) {
            SCOPED_TRACE(describe(half, d, lead, fused) + (with_bias ? " bias" : " no bias"));
            cuda::set_fused_epilogues(fused);
            const int64_t n = d.bt * d.cout;
            const auto x = dyadic(static_cast<size_t>(d.bt * d.cin), ++seed, 4, 8);
            const auto w = dyadic(static_cast<size_t>(d.cout * d.cin), ++seed, 4, 8);
            const auto bias = dyadic(static_cast<size_t>(d.cout), ++seed, 8, 16);
            std::vector<float> sum(static_cast<size_t>(n)), want(sum.size());
            cpu::linear_forward(sum.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr,
                                d.bt, d.cin, d.cout);
            cpu::gelu_forward(want.data(), sum.data(), n);
            want = rounded(want, half);
            const Placed gx = place(x, half, lead), gw = place(w, half, lead);
            const Placed gb = place(bias, DType::f32, lead);
            const Placed out = place_nan(n, half, lead), pre = place_nan(n, half, lead);
            k.linear_gelu_half(kDev, out.ptr(), pre.ptr(), gx.ptr(), gw.ptr(),
                               with_bias ? gb.fptr() : nullptr, half, d.bt, d.cin, d.cout);
            EXPECT_EQ(pre.values(), rounded(sum, half));
            const std::vector<float> got = out.values();
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_LE(std::fabs(got[i] - want[i]),
                        2 * half_step(half) * std::fabs(want[i]) + 1e-3 * (1 + std::fabs(sum[i])))
                  << i << " of pre " << sum[i];
            EXPECT_TRUE(out.guard_intact() && pre.guard_intact());
          }
        }
      }
    }
  }
}

// GELU's backward where the input gradient's product writes (DGELU, DGELU_BGRAD), with pre read
// from an odd offset (the aux pointer's alignment) and widths not multiples of 8. dpre against
// the CPU's gelu'(pre) * (dout @ w) rounded once: beside two output steps, cuBLASLt's gelu' may
// use an approximate tanh, off by ~2^-12 in s = 0.5 (1 + tanh), which gelu' amplifies by at most
// ~12 for |pre| <= 3: 1e-2 |dh|. The bias gradient is the column sums of dpre, of its rounded
// values (the separate kernels) or of the f32 values before the rounding (cuBLASLt): within one
// half step of each term's magnitude, plus f32 summation.
TEST_F(CudaGemmEdges, DgeluEpilogueWithMisalignedPreMatchesTheCpu) {
  const test::ProductSwitches restore;
  DeviceKernels& k = *cuda::kernel_table();
  uint64_t seed = 200;
  for (const DType half : {DType::f16, DType::bf16}) {
    for (const Dims& d : kDims) {
      for (const bool with_db : {false, true}) {
        for (const int64_t lead : {0, 1}) {
          for (const bool fused : {true, false}) {
            SCOPED_TRACE(describe(half, d, lead, fused) + (with_db ? " dbias" : " no dbias"));
            cuda::set_fused_epilogues(fused);
            // Here C_in is the width of dpre (the first product's output), C_out the depth.
            const int64_t n = d.bt * d.cin;
            const auto dout = dyadic(static_cast<size_t>(d.bt * d.cout), ++seed, 4, 8);
            const auto w = dyadic(static_cast<size_t>(d.cout * d.cin), ++seed, 4, 8);
            const auto pre = rounded(random_floats(static_cast<size_t>(n), ++seed, -3, 3), half);
            std::vector<float> dh(static_cast<size_t>(n)), want(dh.size());
            cpu::matmul(dh.data(), dout.data(), w.data(), d.bt, d.cin, d.cout, false, false);
            cpu::gelu_backward(want.data(), pre.data(), dh.data(), n);
            want = rounded(want, half);
            const Placed gd = place(dout, half, lead), gw = place(w, half, lead);
            const Placed gpre = place(pre, half, lead);
            const Placed dpre = place_nan(n, half, lead), db = place_nan(d.cin, DType::f32, lead);
            k.linear_input_grad_dgelu_half(kDev, dpre.ptr(), with_db ? db.fptr() : nullptr,
                                           gd.ptr(), gw.ptr(), gpre.ptr(), half, d.bt, d.cin,
                                           d.cout);
            const std::vector<float> got = dpre.values();
            for (size_t i = 0; i < got.size(); ++i)
              ASSERT_LE(std::fabs(got[i] - want[i]),
                        2 * half_step(half) * std::fabs(want[i]) + 1e-2 * std::fabs(dh[i]) + 1e-6)
                  << i << " of pre " << pre[i] << ", dh " << dh[i];
            EXPECT_EQ(gpre.values(), pre) << "pre is read, not written";
            EXPECT_TRUE(dpre.guard_intact() && db.guard_intact());
            if (!with_db) continue;
            const std::vector<float> got_db = db.values();
            for (int64_t j = 0; j < d.cin; ++j) {
              double sum = 0, mag = 0;
              for (int64_t r = 0; r < d.bt; ++r) {
                sum += got[static_cast<size_t>(r * d.cin + j)];
                mag += std::fabs(got[static_cast<size_t>(r * d.cin + j)]);
              }
              EXPECT_LE(std::fabs(got_db[static_cast<size_t>(j)] - sum),
                        mag * (half_step(half) + d.bt * 0x1p-24) + 1e-6)
                  << "column " << j;
            }
          }
        }
      }
    }
  }
}

// The weight gradient with its bias gradient (BGRADB: a vector as long as cuBLASLt's output has
// columns, our dout's column sums) where the widths are odd, a single output row or column, and
// dout starts at an odd offset. Exact inputs: both must be the CPU's bits, fused or not, in f16,
// bf16 and (the f32 linear's backward) f32.
TEST_F(CudaGemmEdges, WeightGradientWithBiasGradientAtOddWidthsHasTheCpusBits) {
  const test::ProductSwitches restore;
  DeviceKernels& k = *cuda::kernel_table();
  const std::vector<Dims> dims = {{45, 37, 19}, {7, 1, 1}, {300, 70, 1}, {1, 40, 24}, {64, 72, 48}};
  uint64_t seed = 300;
  for (const DType t : {DType::f16, DType::bf16, DType::f32}) {
    for (const Dims& d : dims) {
      for (const int64_t lead : {0, 1}) {
        for (const bool fused : {true, false}) {
          SCOPED_TRACE(describe(t, d, lead, fused));
          cuda::set_fused_epilogues(fused);
          const auto dout = dyadic(static_cast<size_t>(d.bt * d.cout), ++seed, 4, 8);
          const auto x = dyadic(static_cast<size_t>(d.bt * d.cin), ++seed, 4, 8);
          std::vector<float> want_dw(static_cast<size_t>(d.cout * d.cin));
          std::vector<float> want_db(static_cast<size_t>(d.cout));
          cpu::matmul(want_dw.data(), dout.data(), x.data(), d.cout, d.cin, d.bt, true, false);
          cpu::sum_first_dim(want_db.data(), dout.data(), d.bt, d.cout, false);
          const Placed gd = place(dout, t, lead), gx = place(x, t, lead);
          const Placed dw = place_nan(d.cout * d.cin, DType::f32, lead);
          const Placed db = place_nan(d.cout, DType::f32, lead);
          if (t == DType::f32)
            k.linear_backward(kDev, nullptr, dw.fptr(), db.fptr(), gd.fptr(), gx.fptr(), nullptr,
                              d.bt, d.cin, d.cout);
          else
            k.weight_grad_half(kDev, dw.fptr(), db.fptr(), gd.ptr(), gx.ptr(), t, d.bt, d.cin,
                               d.cout, 1.0f);
          EXPECT_EQ(dw.values(), want_dw);
          EXPECT_EQ(db.values(), want_db);
          EXPECT_TRUE(dw.guard_intact() && db.guard_intact());
        }
      }
    }
  }
}

// TF32 rounds the f32 products' operands to 10 mantissa bits only while it is allowed. a holds
// (1 + 2^-11) times small integers (TF32 drops that bit), b small integers: exact f32 sums any
// order, so off means the CPU's bits. On, each product may be off by its operands' roundings
// (2^-10 relative each, truncating or not): 2^-9 of the sum of |products|. Off again after on
// must find the exact algorithm again (the algorithm cache is keyed on the switch).
TEST_F(CudaGemmEdges, Tf32RoundsProductsOnlyWhileAllowed) {
  const test::ProductSwitches restore;
  DeviceKernels& k = *cuda::kernel_table();
  const int64_t M = 48, N = 37, K = 64;
  auto a = dyadic(static_cast<size_t>(M * K), 400, 3, 1);
  for (float& v : a) v *= 1.0f + 0x1p-11f;
  const auto b = dyadic(static_cast<size_t>(K * N), 401, 3, 1);
  std::vector<float> want(static_cast<size_t>(M * N)), mag(want.size());
  cpu::matmul(want.data(), a.data(), b.data(), M, N, K, false, false);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t p = 0; p < K; ++p)
        mag[static_cast<size_t>(i * N + j)] +=
            std::fabs(a[static_cast<size_t>(i * K + p)] * b[static_cast<size_t>(p * N + j)]);
  const Tensor ga = up(a), gb = up(b);
  for (const bool tf32 : {false, true, false}) {
    SCOPED_TRACE(tf32 ? "tf32" : "f32");
    cuda::set_allow_tf32(tf32);
    Tensor out = up(std::vector<float>(want.size(), kNaN));
    k.matmul(kDev, test::fp(out), test::fp(ga), test::fp(gb), 1, M, N, K, false, false, 0, 0);
    const std::vector<float> got = out.to_vector();
    if (!tf32) {
      EXPECT_EQ(got, want);
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - want[i]), mag[i] * 0x1p-9) << i;
  }
}

// The bias gradient is a sum, not a product: TF32 licenses rounding the weight gradient's
// operands, not dout's column sums, and the separate column sum never rounds them. With dout
// (1 + 2^-11) times small integers, the column sums are exact in f32 whatever the order, so the
// fused BGRADB under TF32 must give the CPU's bits too; the weight gradient within TF32's bound.
TEST_F(CudaGemmEdges, BiasGradientStaysAnF32SumWithTf32Allowed) {
  const test::ProductSwitches restore;
  cuda::set_allow_tf32(true);
  DeviceKernels& k = *cuda::kernel_table();
  const int64_t BT = 96, C_in = 40, C_out = 24;
  auto dout = dyadic(static_cast<size_t>(BT * C_out), 500, 3, 1);
  for (float& v : dout) v *= 1.0f + 0x1p-11f;
  const auto x = dyadic(static_cast<size_t>(BT * C_in), 501, 3, 1);
  std::vector<float> want_dw(static_cast<size_t>(C_out * C_in)), mag(want_dw.size());
  std::vector<float> want_db(static_cast<size_t>(C_out));
  cpu::matmul(want_dw.data(), dout.data(), x.data(), C_out, C_in, BT, true, false);
  cpu::sum_first_dim(want_db.data(), dout.data(), BT, C_out, false);
  for (int64_t i = 0; i < C_out; ++i)
    for (int64_t j = 0; j < C_in; ++j)
      for (int64_t r = 0; r < BT; ++r)
        mag[static_cast<size_t>(i * C_in + j)] += std::fabs(
            dout[static_cast<size_t>(r * C_out + i)] * x[static_cast<size_t>(r * C_in + j)]);
  const Tensor gd = up(dout), gx = up(x);
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "separate");
    cuda::set_fused_epilogues(fused);
    Tensor dw = up(std::vector<float>(want_dw.size(), kNaN));
    Tensor db = up(std::vector<float>(want_db.size(), kNaN));
    k.linear_backward(kDev, nullptr, test::fp(dw), test::fp(db), test::fp(gd), test::fp(gx),
                      nullptr, BT, C_in, C_out);
    EXPECT_EQ(db.to_vector(), want_db);
    const std::vector<float> got = dw.to_vector();
    for (size_t i = 0; i < got.size(); ++i)
      ASSERT_LE(std::fabs(got[i] - want_dw[i]), mag[i] * 0x1p-9) << i;
  }
}

// A residual the product joins as cuBLASLt's C (beta 1) together with the bias epilogue: the
// device adds (product + residual) + bias where the CPU adds (product + bias) + residual; with
// exact inputs the order cannot matter, so the bits must be the CPU's, at odd offsets and widths
// and a single column too; the residual is read and left as it was. Half operands with an f32
// output (autocast's residual linear) and the f32 linear alike.
TEST_F(CudaGemmEdges, ResidualAsCWithBiasAtOddOffsetsHasTheCpusBits) {
  const test::ProductSwitches restore;
  DeviceKernels& k = *cuda::kernel_table();
  uint64_t seed = 600;
  for (const DType t : {DType::f16, DType::bf16, DType::f32}) {
    for (const Dims& d : kDims) {
      for (const bool with_bias : {false, true}) {
        for (const int64_t lead : {0, 1}) {
          SCOPED_TRACE(describe(t, d, lead, true) + (with_bias ? " bias" : " no bias"));
          const int64_t n = d.bt * d.cout;
          const auto x = dyadic(static_cast<size_t>(d.bt * d.cin), ++seed, 4, 8);
          const auto w = dyadic(static_cast<size_t>(d.cout * d.cin), ++seed, 4, 8);
          const auto bias = dyadic(static_cast<size_t>(d.cout), ++seed, 8, 16);
          const auto res = dyadic(static_cast<size_t>(n), ++seed, 64, 64);
          std::vector<float> want(static_cast<size_t>(n));
          cpu::linear_forward(want.data(), x.data(), w.data(), with_bias ? bias.data() : nullptr,
                              d.bt, d.cin, d.cout);
          cpu::add(want.data(), res.data(), want.data(), n);
          const Placed gx = place(x, t, lead), gw = place(w, t, lead);
          const Placed gb = place(bias, DType::f32, lead), gres = place(res, DType::f32, lead);
          const Placed out = place_nan(n, DType::f32, lead);
          const float* b = with_bias ? gb.fptr() : nullptr;
          if (t == DType::f32)
            k.linear_forward(kDev, out.fptr(), gx.fptr(), gw.fptr(), b, d.bt, d.cin, d.cout,
                             gres.fptr());
          else
            k.matmul_half(kDev, out.ptr(), DType::f32, gx.ptr(), gw.ptr(), t, b, 1, d.bt, d.cout,
                          d.cin, false, true, 0, 0, gres.fptr(), 1.0f);
          EXPECT_EQ(out.values(), want);
          EXPECT_EQ(gres.values(), res);
          EXPECT_TRUE(out.guard_intact());
        }
      }
    }
  }
}

// A half output with the f32 bias (autocast's linear into a half consumer): the f32 sum and bias
// rounded once, whether cuBLASLt takes an f32 bias on a half output or the product goes through
// an f32 output and a cast. The sums and the bias have bits below the output's precision, so a
// product rounded before the bias is added (twice rounded) would differ. Also the batched half
// products without a bias: a transposed, alpha 0.5, a single row, depth 29.
TEST_F(CudaGemmEdges, HalfOutputWithF32BiasIsRoundedOnceAtOddShapes) {
  const test::ProductSwitches restore;
  DeviceKernels& k = *cuda::kernel_table();
  uint64_t seed = 700;
  for (const DType half : {DType::f16, DType::bf16}) {
    for (const Dims& d : kDims) {
      for (const int64_t lead : {0, 1}) {
        SCOPED_TRACE(describe(half, d, lead, true));
        const int64_t n = d.bt * d.cout;
        // Sums of up to 18 significant bits (multiples of 2^-12 below 64), more than either half
        // type holds, with a bias down to 2^-14: exact in f32, rounded once or twice apart.
        const auto x = dyadic(static_cast<size_t>(d.bt * d.cin), ++seed, 64, 64);
        const auto w = dyadic(static_cast<size_t>(d.cout * d.cin), ++seed, 64, 64);
        const auto bias = dyadic(static_cast<size_t>(d.cout), ++seed, 1 << 10, 1 << 14);
        std::vector<float> want(static_cast<size_t>(n));
        cpu::linear_forward(want.data(), x.data(), w.data(), bias.data(), d.bt, d.cin, d.cout);
        const Placed gx = place(x, half, lead), gw = place(w, half, lead);
        const Placed gb = place(bias, DType::f32, lead), out = place_nan(n, half, lead);
        k.matmul_half(kDev, out.ptr(), half, gx.ptr(), gw.ptr(), half, gb.fptr(), 1, d.bt, d.cout,
                      d.cin, false, true, 0, 0, nullptr, 1.0f);
        EXPECT_EQ(out.values(), rounded(want, half));
        EXPECT_TRUE(out.guard_intact());
      }
    }
    const int64_t batch = 3, M = 1, N = 37, K = 29;
    SCOPED_TRACE(std::string(dtype_name(half)) + " batched");
    const auto a = dyadic(static_cast<size_t>(batch * K * M), ++seed, 64, 64);
    const auto b = dyadic(static_cast<size_t>(batch * K * N), ++seed, 64, 64);
    std::vector<float> want(static_cast<size_t>(batch * M * N));
    for (int64_t i = 0; i < batch; ++i)
      cpu::matmul(want.data() + i * M * N, a.data() + i * K * M, b.data() + i * K * N, M, N, K,
                  true, false, 0.5f, 0.0f);
    const Placed ga = place(a, half, 1), gb = place(b, half, 1);
    const Placed out = place_nan(batch * M * N, half, 1);
    k.matmul_half(kDev, out.ptr(), half, ga.ptr(), gb.ptr(), half, nullptr, batch, M, N, K, true,
                  false, K * M, K * N, nullptr, 0.5f);
    EXPECT_EQ(out.values(), rounded(want, half));
    EXPECT_TRUE(out.guard_intact());
  }
}

}  // namespace
}  // namespace meshtrain

#else

TEST(CudaGemmEdges, BuiltWithoutCuda) {
  MT_SKIP_UNLESS("cuda", false, "built without CUDA: the device product tests are not compiled");
}

#endif
