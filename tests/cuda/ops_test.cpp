// The cross-device op test: every CUDA kernel runs on random inputs next to its CPU reference
// (tensor/cpu), and the results must agree within tolerances that follow from the arithmetic
// (exact for casts and single additions, summation-order error for reductions and products,
// output rounding for bf16/f16). Skipped, with the reason, where the process has no device.
#include <gtest/gtest.h>

#include "tests/support/capability.h"

#if MESHTRAIN_HAVE_CUDA

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "device_vectors.h"
#include "meshtrain/autograd/autocast.h"
#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/kernels/adamw.h"
#include "meshtrain/cuda/kernels/attention.h"
#include "meshtrain/cuda/kernels/attention_gemm.h"
#include "meshtrain/cuda/kernels/cast.h"
#include "meshtrain/cuda/kernels/cross_entropy.h"
#include "meshtrain/cuda/kernels/dropout.h"
#include "meshtrain/cuda/kernels/elementwise.h"
#include "meshtrain/cuda/kernels/embedding.h"
#include "meshtrain/cuda/kernels/flash_attention.h"
#include "meshtrain/cuda/kernels/gelu.h"
#include "meshtrain/cuda/kernels/gemm.h"
#include "meshtrain/cuda/kernels/index_rows.h"
#include "meshtrain/cuda/kernels/layer_norm.h"
#include "meshtrain/cuda/kernels/sgd.h"
#include "meshtrain/cuda/kernels/step_gate.h"
#include "meshtrain/cuda/kernels/sum_squares.h"
#include "meshtrain/cuda/kernels/vocab_parallel_cross_entropy.h"
#include "meshtrain/tensor/cpu/kernels.h"
#include "meshtrain/tensor/ops.h"
#include "tests/cuda/attention_reference.h"
#include "tests/cuda/step_gate_expect.h"

namespace meshtrain {
namespace {

using test::all_close;
using test::dev_empty;
using test::fp;
using test::ip;
using test::kDev;
using test::random_floats;
using test::random_ints;
using test::rounded;
using test::stream;
using test::up;

class CudaOps : public test::DeviceKernelTest {};

TEST_F(CudaOps, CastsRoundLikeTheHost) {
  std::vector<float> v = random_floats(4096, 1, -70000.0f, 70000.0f);
  const std::vector<float> small = random_floats(1024, 2, -1e-4f, 1e-4f);  // f16 subnormals
  v.insert(v.end(), small.begin(), small.end());
  const float inf = std::numeric_limits<float>::infinity();
  for (float x : {0.0f, -0.0f, inf, -inf, 65504.0f, 65520.0f, 1e-8f, 3.0e38f, -1.5f,
                  std::numeric_limits<float>::quiet_NaN()})
    v.push_back(x);
  const int64_t n = static_cast<int64_t>(v.size());
  Tensor d = up(v);
  for (DType t : {DType::bf16, DType::f16}) {
    Tensor out = dev_empty(n, t);
    cuda::cast(out.data_ptr(), t, d.data_ptr(), DType::f32, n, stream());
    Tensor got = out.to(Device::cpu());
    Tensor want = Tensor::from_vector(v, {n}).to(t);
    const auto* g = static_cast<const uint16_t*>(got.data_ptr());
    const auto* w = static_cast<const uint16_t*>(want.data_ptr());
    const std::vector<float> gf = got.to_vector(), wf = want.to_vector();
    int mismatches = 0;
    for (int64_t i = 0; i < n; ++i) {
      const bool nan = std::isnan(wf[static_cast<size_t>(i)]);
      if (nan ? !std::isnan(gf[static_cast<size_t>(i)]) : g[i] != w[i]) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(t);
    // Widening back to f32 is exact.
    Tensor wide = dev_empty(n);
    cuda::cast(wide.data_ptr(), DType::f32, out.data_ptr(), t, n, stream());
    EXPECT_TRUE(all_close(wide.to_vector(), wf, 0, 0)) << dtype_name(t);
  }
  // A multiple of four elements takes the vectorised f32 -> bf16 kernel: the same bits.
  const int64_t n4 = n / 4 * 4;
  Tensor out = dev_empty(n4, DType::bf16);
  cuda::cast(out.data_ptr(), DType::bf16, d.data_ptr(), DType::f32, n4, stream());
  Tensor want =
      Tensor::from_vector(std::vector<float>(v.begin(), v.begin() + n4), {n4}).to(DType::bf16);
  Tensor got = out.to(Device::cpu());
  EXPECT_EQ(0, std::memcmp(got.data_ptr(), want.data_ptr(), static_cast<size_t>(n4) * 2));
}

TEST_F(CudaOps, AddMulScaleAxpyColumnSum) {
  const int64_t N = 37, C = 301, n = N * C;
  const auto a = random_floats(static_cast<size_t>(n), 3);
  const auto b = random_floats(static_cast<size_t>(n), 4);
  std::vector<float> want(static_cast<size_t>(n));
  Tensor da = up(a), db = up(b), out = dev_empty(n);
  // One element at a time (n odd) and four at a time (a multiple of four): the CPU's bits.
  for (const int64_t m : {n, n - 1}) {
    SCOPED_TRACE(m);
    const auto head = [&](const Tensor& t) {
      auto v = t.to_vector();
      v.resize(static_cast<size_t>(m));
      return v;
    };
    want.assign(static_cast<size_t>(m), 0.0f);
    cpu::add(want.data(), a.data(), b.data(), m);
    cuda::add(fp(out), fp(da), fp(db), m, stream());
    EXPECT_EQ(head(out), want);
    cpu::mul(want.data(), a.data(), b.data(), m);
    cuda::mul(fp(out), fp(da), fp(db), m, stream());
    EXPECT_EQ(head(out), want);
    cpu::scale(want.data(), a.data(), -0.3f, m);
    cuda::scale(fp(out), fp(da), -0.3f, m, stream());
    EXPECT_EQ(head(out), want);
  }
  {
    // Many arrays in place, more than one launch holds (70), one of several blocks, one empty:
    // scale's bits for each.
    std::vector<Tensor> arrays;
    std::vector<float*> xs;
    std::vector<int64_t> ns;
    for (int i = 0; i < 70; ++i) {
      const int64_t len = i == 3 ? 0 : (i == 5 ? 200001 : 1 + 13 * i);
      arrays.push_back(up(random_floats(static_cast<size_t>(len) + 1, 400 + i)));
      xs.push_back(fp(arrays.back()));
      ns.push_back(len);
    }
    std::vector<std::vector<float>> wants;
    for (const Tensor& t : arrays) {
      auto v = t.to_vector();
      const size_t len = v.size() - 1;
      cpu::scale(v.data(), v.data(), 1.7f, static_cast<int64_t>(len));  // the last one stays
      wants.push_back(v);
    }
    cuda::scale_many(xs.data(), ns.data(), static_cast<int64_t>(xs.size()), 1.7f, stream());
    for (size_t i = 0; i < arrays.size(); ++i) EXPECT_EQ(arrays[i].to_vector(), wants[i]) << i;
  }
  want = b;
  cpu::axpy(want.data(), a.data(), 0.7f, n);
  cuda::axpy(fp(db), fp(da), 0.7f, n, stream());
  EXPECT_TRUE(all_close(db.to_vector(), want, 1e-6, 1e-7));
  std::vector<float> cs(static_cast<size_t>(C), 1.0f);
  for (int64_t r = 0; r < N; ++r)
    for (int64_t c = 0; c < C; ++c) cs[static_cast<size_t>(c)] += a[static_cast<size_t>(r * C + c)];
  Tensor dcs = up(std::vector<float>(static_cast<size_t>(C), 1.0f));
  cuda::column_sum_accumulate(fp(dcs), fp(da), N, C, stream());
  EXPECT_TRUE(all_close(dcs.to_vector(), cs, 1e-5, 1e-5));
}

TEST_F(CudaOps, SumSquaresInDoubleAndTheSameEveryRun) {
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{1} << 20, (int64_t{1} << 20) + 77}) {
    const auto x = random_floats(static_cast<size_t>(n), 7, -3.0f, 3.0f);
    double want = 0.0;
    for (float v : x) want += static_cast<double>(v) * v;
    Tensor dx = up(x);
    Tensor scratch = dev_empty(2 * (cuda::kSumSquaresScratch + 1));  // doubles, as float pairs
    auto* parts = static_cast<double*>(scratch.data_ptr());
    double* total = parts + cuda::kSumSquaresScratch;
    double got[2] = {0.0, 0.0};
    for (double& g : got) {
      cuda::sum_squares(total, parts, fp(dx), n, stream());
      ASSERT_EQ(cudaMemcpy(&g, total, sizeof(double), cudaMemcpyDeviceToHost), cudaSuccess);
    }
    EXPECT_NEAR(got[0], want, 1e-12 * want) << "n = " << n;
    EXPECT_EQ(got[0], got[1]) << "n = " << n << ": the summation order is fixed";
  }
}

// The gradient norm's form: every array summed with one wait for the device, each with the bits
// of its own sum_squares (the same kernels, one scratch reused in stream order).
TEST_F(CudaOps, SumSquaresEachGivesEachArraysOwnBits) {
  std::vector<Tensor> xs;
  for (int64_t n : {int64_t{1000}, int64_t{1} << 20, int64_t{0}, int64_t{3}, int64_t{777777}})
    xs.push_back(
        up(random_floats(static_cast<size_t>(n), 17 + static_cast<uint64_t>(n), -2.0f, 2.0f)));
  const std::vector<double> each = ops::sum_squares_each(xs);
  ASSERT_EQ(each.size(), xs.size());
  for (size_t i = 0; i < xs.size(); ++i)
    EXPECT_EQ(each[i], ops::sum_squares(xs[i])) << "array " << i << ", " << xs[i].numel();
  EXPECT_EQ(each[2], 0.0);
}

TEST_F(CudaOps, GemmF32EveryTransposeWithBiasAndBeta) {
  const int64_t M = 37, N = 53, K = 71;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      for (bool with_bias : {false, true}) {
        const auto a = random_floats(static_cast<size_t>(M * K), 10 + ta);
        const auto b = random_floats(static_cast<size_t>(K * N), 20 + tb);
        const auto c0 = random_floats(static_cast<size_t>(M * N), 30);
        const auto bias = random_floats(static_cast<size_t>(N), 40);
        const float alpha = 0.75f, beta = with_bias ? 0.0f : 0.5f;
        std::vector<float> want = c0;
        cpu::matmul(want.data(), a.data(), b.data(), M, N, K, ta, tb, alpha, beta);
        if (with_bias)
          for (int64_t i = 0; i < M * N; ++i) want[static_cast<size_t>(i)] += bias[i % N];
        Tensor da = up(a), db = up(b), dc = up(c0), dbias = up(bias);
        cuda::GemmShape s;
        s.M = M;
        s.N = N;
        s.K = K;
        s.trans_a = ta;
        s.trans_b = tb;
        cuda::matmul(dc.data_ptr(), da.data_ptr(), db.data_ptr(),
                     with_bias ? dbias.data_ptr() : nullptr, DType::f32, s, alpha, beta, stream());
        EXPECT_TRUE(all_close(dc.to_vector(), want, 1e-5, 1e-5))
            << "trans_a " << ta << " trans_b " << tb << " bias " << with_bias;
      }
    }
  }
}

// A product over an empty sum (K = 0: a rank's empty batch in a weight gradient) writes what the
// CPU's gemm writes: beta * C plus the bias, whatever the output held (NaN here); the weight
// gradient with its bias gradient writes zeros.
TEST_F(CudaOps, GemmOverAnEmptySumWritesBetaCAndTheBias) {
  const int64_t M = 5, N = 7;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto c0 = random_floats(static_cast<size_t>(M * N), 31);
  const auto bias = random_floats(static_cast<size_t>(N), 41);
  Tensor none = dev_empty(0), dbias = up(bias);
  for (bool ta : {false, true})
    for (const float beta : {0.0f, 0.5f})
      for (bool with_bias : {false, true}) {
        SCOPED_TRACE(std::to_string(ta) + " beta " + std::to_string(beta) + " bias " +
                     std::to_string(with_bias));
        std::vector<float> want = beta == 0.0f ? std::vector<float>(c0.size(), nan) : c0;
        cpu::matmul(want.data(), nullptr, nullptr, M, N, 0, ta, false, 1.0f, beta);
        if (with_bias)
          for (int64_t i = 0; i < M * N; ++i) want[static_cast<size_t>(i)] += bias[i % N];
        Tensor out = up(beta == 0.0f ? std::vector<float>(c0.size(), nan) : c0);
        cuda::matmul(out.data_ptr(), none.data_ptr(), none.data_ptr(),
                     with_bias ? dbias.data_ptr() : nullptr, DType::f32,
                     cuda::gemm_shape(M, N, 0, ta), 1.0f, beta, stream());
        EXPECT_EQ(out.to_vector(), want);
      }
  for (const DType t : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(t));
    Tensor dw = up(std::vector<float>(static_cast<size_t>(M * N), nan));
    Tensor db = up(std::vector<float>(static_cast<size_t>(M), nan));
    Tensor empty = dev_empty(0, t);
    cuda::GemmShape s = cuda::gemm_shape(M, N, 0, true);
    s.f32_out = t != DType::f32;
    cuda::matmul_bias_grad(dw.data_ptr(), fp(db), empty.data_ptr(), empty.data_ptr(), t, s,
                           stream());
    EXPECT_EQ(dw.to_vector(), std::vector<float>(static_cast<size_t>(M * N), 0.0f));
    EXPECT_EQ(db.to_vector(), std::vector<float>(static_cast<size_t>(M), 0.0f));
  }
}

TEST_F(CudaOps, GemmHalfTypesAccumulateInF32) {
  const int64_t M = 64, N = 96, K = 128;
  for (DType t : {DType::bf16, DType::f16}) {
    const auto a = rounded(random_floats(static_cast<size_t>(M * K), 50), t);
    const auto b = rounded(random_floats(static_cast<size_t>(N * K), 51), t);
    const auto bias = rounded(random_floats(static_cast<size_t>(N), 52), t);
    std::vector<float> want(static_cast<size_t>(M * N));
    cpu::matmul(want.data(), a.data(), b.data(), M, N, K, false, true);
    for (int64_t i = 0; i < M * N; ++i) want[static_cast<size_t>(i)] += bias[i % N];
    Tensor da = up(a).to(t), db = up(b).to(t), dbias = up(bias).to(t);
    Tensor out = dev_empty(M * N, t);
    cuda::linear_forward(out.data_ptr(), da.data_ptr(), db.data_ptr(), dbias.data_ptr(), t, M, K, N,
                         stream());
    // The only rounding is the output's: half an ulp of bf16 (2^-9) or f16 (2^-12), relative.
    const double rtol = t == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;
    EXPECT_TRUE(all_close(out.to_vector(), want, rtol, 1e-4)) << dtype_name(t);
  }
}

TEST_F(CudaOps, GemmBatchedWithSharedAndStridedOperands) {
  const int64_t batch = 3, M = 20, N = 24, K = 16;
  const auto a = random_floats(static_cast<size_t>(batch * M * K), 60);
  const auto b = random_floats(static_cast<size_t>(batch * K * N), 61);
  for (bool shared_b : {false, true}) {
    std::vector<float> want(static_cast<size_t>(batch * M * N));
    cpu::matmul_batched(want.data(), a.data(), b.data(), batch, M, N, K, false, false, M * N, M * K,
                        shared_b ? 0 : K * N);
    Tensor da = up(a), db = up(b), out = dev_empty(batch * M * N);
    cuda::GemmShape s;
    s.M = M;
    s.N = N;
    s.K = K;
    s.batch = batch;
    s.stride_a = M * K;
    s.stride_b = shared_b ? 0 : K * N;
    s.stride_out = M * N;
    cuda::matmul(out.data_ptr(), da.data_ptr(), db.data_ptr(), nullptr, DType::f32, s, 1.0f, 0.0f,
                 stream());
    EXPECT_TRUE(all_close(out.to_vector(), want, 1e-5, 1e-5)) << "shared b " << shared_b;
  }
}

TEST_F(CudaOps, LinearBackwardAccumulates) {
  const int64_t BT = 45, Cin = 64, Cout = 80;
  const auto inp = random_floats(static_cast<size_t>(BT * Cin), 70);
  const auto w = random_floats(static_cast<size_t>(Cout * Cin), 71);
  const auto dout = random_floats(static_cast<size_t>(BT * Cout), 72);
  auto dinp = random_floats(static_cast<size_t>(BT * Cin), 73);
  auto dw = random_floats(static_cast<size_t>(Cout * Cin), 74);
  auto db = random_floats(static_cast<size_t>(Cout), 75);
  Tensor g_inp = up(inp), g_w = up(w), g_dout = up(dout), g_dinp = up(dinp), g_dw = up(dw),
         g_db = up(db);
  cpu::linear_backward(dinp.data(), dw.data(), db.data(), dout.data(), inp.data(), w.data(), BT,
                       Cin, Cout);
  cuda::linear_backward(g_dinp.data_ptr(), g_dw.data_ptr(), fp(g_db), g_dout.data_ptr(),
                        g_inp.data_ptr(), g_w.data_ptr(), DType::f32, BT, Cin, Cout, stream());
  EXPECT_TRUE(all_close(g_dinp.to_vector(), dinp, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(g_dw.to_vector(), dw, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(g_db.to_vector(), db, 1e-5, 1e-5));
}

TEST_F(CudaOps, GeluForwardBackward) {
  auto x = random_floats(100003, 80, -6.0f, 6.0f);
  x.push_back(-100.0f);
  x.push_back(100.0f);
  const int64_t n = static_cast<int64_t>(x.size());
  const auto dout = random_floats(x.size(), 81);
  std::vector<float> y(x.size()), dx(x.size());
  cpu::gelu_forward(y.data(), x.data(), n);
  cpu::gelu_backward(dx.data(), x.data(), dout.data(), n);
  Tensor gx = up(x), gdout = up(dout), gy = dev_empty(n), gdx = dev_empty(n);
  cuda::gelu_forward(fp(gy), DType::f32, fp(gx), DType::f32, n, stream());
  cuda::gelu_backward(fp(gdx), DType::f32, fp(gx), DType::f32, fp(gdout), DType::f32, n, stream());
  EXPECT_TRUE(all_close(gy.to_vector(), y, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(gdx.to_vector(), dx, 1e-5, 1e-6));
}

// A mixture of experts' row moves against the CPU's: the gather and the unweighted scatter-add
// bit for bit, the gated scatter-add within a rounding (a fused multiply-add on one side or
// both), the backward's row products exactly and its dot products (double, another order)
// within a rounding. Rows of 37 columns: no vector path to hide behind.
TEST_F(CudaOps, IndexRowsFollowTheCpu) {
  const int64_t T = 50, C = 37, n = 23;
  const auto src = random_floats(static_cast<size_t>(T * C), 120);
  const auto rows_src = random_floats(static_cast<size_t>(n * C), 121);
  const auto weights = random_floats(static_cast<size_t>(n), 122, 0.0f, 1.0f);
  std::vector<int32_t> rows;  // distinct, out of order
  for (int32_t i = 0; i < n; ++i) rows.push_back((i * 17 + 5) % static_cast<int32_t>(T));
  std::vector<float> gathered(static_cast<size_t>(n * C));
  cpu::gather_rows(gathered.data(), src.data(), rows.data(), n, C);
  Tensor gsrc = up(src), grows = up(rows), gout = dev_empty(n * C);
  cuda::gather_rows(fp(gout), fp(gsrc), ip(grows), n, C, stream());
  EXPECT_EQ(gout.to_vector(), gathered);
  for (const bool weighted : {false, true}) {
    SCOPED_TRACE(weighted ? "weighted" : "plain");
    std::vector<float> out = src;  // added into what is there
    const float* w = weighted ? weights.data() : nullptr;
    cpu::scatter_add_rows(out.data(), rows_src.data(), rows.data(), w, n, C);
    Tensor gdst = up(src), grs = up(rows_src), gw = up(weights);
    cuda::scatter_add_rows(fp(gdst), fp(grs), ip(grows), weighted ? fp(gw) : nullptr, n, C,
                           stream());
    if (weighted) {
      EXPECT_TRUE(all_close(gdst.to_vector(), out, 1e-6, 1e-7));
    } else {
      EXPECT_EQ(gdst.to_vector(), out);
    }
  }
  std::vector<float> dsrc(static_cast<size_t>(n * C)), dw(static_cast<size_t>(n));
  cpu::weighted_rows_backward(dsrc.data(), dw.data(), src.data(), rows_src.data(), weights.data(),
                              rows.data(), n, C);
  Tensor gdsrc = dev_empty(n * C), gdw = dev_empty(n), grs = up(rows_src), gw = up(weights);
  cuda::weighted_rows_backward(fp(gdsrc), fp(gdw), fp(gsrc), fp(grs), fp(gw), ip(grows), n, C,
                               stream());
  EXPECT_EQ(gdsrc.to_vector(), dsrc);
  EXPECT_TRUE(all_close(gdw.to_vector(), dw, 1e-6, 1e-7));
}

// A vocabulary-parallel table and loss on one rank's columns [begin, begin + valid) with padding
// columns past valid: the lookup and its gradient (repeated ids, ids held elsewhere) are the
// CPU's bits; the loss's parts follow the CPU within a few ulps (the device adds its double sum
// in a tree, with its expf), the maxima exactly.
TEST_F(CudaOps, VocabParallelKernelsFollowTheCpu) {
  const int64_t N = 50, C = 37, begin = 40, valid = 26, V = 29;
  std::vector<int32_t> ids;
  for (int32_t i = 0; i < N; ++i) ids.push_back((i * 13 + 7) % 90);  // repeats, most elsewhere
  const auto table = random_floats(static_cast<size_t>(valid * C), 130);
  const auto dout = random_floats(static_cast<size_t>(N * C), 131);
  std::vector<float> looked(static_cast<size_t>(N * C)), dtable(static_cast<size_t>(valid * C));
  cpu::vocab_lookup_forward(looked.data(), ids.data(), table.data(), N, C, begin, valid);
  cpu::vocab_lookup_backward(dtable.data(), dout.data(), ids.data(), N, C, begin, valid);
  Tensor gids = up(ids), gtable = up(table), gout = dev_empty(N * C);
  cuda::vocab_lookup_forward(fp(gout), ip(gids), fp(gtable), N, C, begin, valid, stream());
  EXPECT_EQ(gout.to_vector(), looked);
  Tensor gd = up(std::vector<float>(static_cast<size_t>(valid * C), 0.0f)), gdout = up(dout);
  cuda::vocab_lookup_backward(fp(gd), fp(gdout), ip(gids), N, C, begin, valid, stream());
  EXPECT_EQ(gd.to_vector(), dtable);

  const auto logits = random_floats(static_cast<size_t>(N * V), 132, -6.0f, 6.0f);
  std::vector<int32_t> targets;
  for (int32_t i = 0; i < N; ++i) targets.push_back(i % 9 == 0 ? -1 : (i * 11 + 3) % 100);
  const auto rows = static_cast<size_t>(N);
  std::vector<float> mx(rows), sum(rows), tl(rows), dl(static_cast<size_t>(N * V));
  cpu::vocab_parallel_row_max(mx.data(), logits.data(), N, V, valid);
  cpu::vocab_parallel_row_sums(sum.data(), tl.data(), logits.data(), mx.data(), targets.data(), N,
                               V, valid, begin, -1);
  const float dloss = 0.75f;
  std::vector<float> mean_count(2);
  cpu::vocab_parallel_loss_mean(mean_count.data(), mx.data(), sum.data(), tl.data(), targets.data(),
                                N, -1);
  const float count = mean_count[1];
  EXPECT_EQ(count, 44.0f);
  cpu::vocab_parallel_backward(dl.data(), logits.data(), mx.data(), sum.data(), targets.data(), N,
                               V, valid, begin, -1, dloss / count);
  Tensor gl = up(logits), gt = up(targets), gmax = dev_empty(N), gsum = dev_empty(N),
         gtl = dev_empty(N), gdl = up(std::vector<float>(static_cast<size_t>(N * V), 9.0f)),
         gdloss = up(std::vector<float>{dloss}), gmc = dev_empty(2);
  cuda::vocab_parallel_row_max(fp(gmax), fp(gl), N, V, valid, stream());
  EXPECT_EQ(gmax.to_vector(), mx);
  cuda::vocab_parallel_row_sums(fp(gsum), fp(gtl), fp(gl), fp(gmax), ip(gt), N, V, valid, begin, -1,
                                stream());
  EXPECT_TRUE(all_close(gsum.to_vector(), sum, 1e-5, 0.0));
  EXPECT_EQ(gtl.to_vector(), tl);
  // The mean from the CPU's rows (the device's sums differ in their last bits), in the CPU's order.
  Tensor hsum = up(sum), htl = up(tl);
  cuda::vocab_parallel_loss_mean(fp(gmc), fp(gmax), fp(hsum), fp(htl), ip(gt), N, -1, stream());
  const std::vector<float> got_mc = gmc.to_vector();
  EXPECT_EQ(got_mc[1], count);
  EXPECT_TRUE(all_close({got_mc[0]}, {mean_count[0]}, 1e-6, 0.0));
  cuda::vocab_parallel_backward(fp(gdl), fp(gl), fp(gmax), fp(gsum), ip(gt), N, V, valid, begin, -1,
                                fp(gdloss), fp(gmc) + 1, stream());
  // Every element written: ignored rows and padding columns are zeros, as on the CPU.
  EXPECT_TRUE(all_close(gdl.to_vector(), dl, 1e-5, 1e-7));
}

// A row added over the leading dimensions and a dimension's sum (a bias, a position table and
// their gradients under tensor parallelism) are the CPU's bits: one addition an element, and the
// sum in the CPU's order from zero.
TEST_F(CudaOps, AddRowsAndSumDimFollowTheCpu) {
  const int64_t outer = 3, mid = 37, inner = 129;
  const auto a = random_floats(static_cast<size_t>(outer * mid * inner), 134);
  const auto row = random_floats(static_cast<size_t>(mid * inner), 135);
  const int64_t n = outer * mid * inner;
  std::vector<float> sum(static_cast<size_t>(n)), dims(static_cast<size_t>(outer * inner));
  cpu::add_rows(sum.data(), a.data(), row.data(), n, mid * inner);
  cpu::sum_dim(dims.data(), a.data(), outer, mid, inner);
  Tensor ga = up(a), grow = up(row), gsum = dev_empty(n), gdims = dev_empty(outer * inner);
  cuda::add_rows(fp(gsum), fp(ga), fp(grow), n, mid * inner, stream());
  cuda::sum_dim(fp(gdims), fp(ga), outer, mid, inner, stream());
  EXPECT_EQ(gsum.to_vector(), sum);
  EXPECT_EQ(gdims.to_vector(), dims);
}

// Narrow and cat of device tensors are strided copies within the device (one cudaMemcpy2D a
// part), whatever the dtype: the CPU's values, and a narrow's gradient on the device.
TEST_F(CudaOps, NarrowAndCatCopyBlocksWithinTheDevice) {
  const Device dev = Device::cuda(0);
  const auto v = random_floats(2 * 6 * 5, 133);
  for (const DType dtype : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(dtype));
    const Tensor a = Tensor::from_vector(v, {2, 6, 5}).to(dtype);
    const Tensor da = a.to(dev);
    for (int64_t dim = 0; dim < 3; ++dim) {
      SCOPED_TRACE(dim);
      const int64_t len = a.size(dim) - 1;
      EXPECT_TRUE(ops::equal(ops::narrow(da, dim, 1, len), ops::narrow(a, dim, 1, len)));
      EXPECT_TRUE(ops::equal(ops::cat({da, ops::narrow(da, dim, 1, len), da}, dim),
                             ops::cat({a, ops::narrow(a, dim, 1, len), a}, dim)));
    }
  }
}

// The device's dropout keeps exactly the CPU's elements with the CPU's scale, bit for bit: four
// at a time and one at a time (an odd length, an array one element off its alignment), at an
// offset past 2^32 (the element index is 64-bit), in place, and with p = 1 (all dropped).
TEST_F(CudaOps, DropoutKeepsTheCpusElementsBitForBit) {
  const auto x = random_floats(40000, 82, -3.0f, 3.0f);
  struct Case {
    int64_t n, skip;
    float p;
    uint64_t seed, offset;
  };
  for (const Case& c :
       {Case{40000, 0, 0.1f, 5, 0}, Case{39999, 0, 0.5f, 6, (uint64_t{1} << 33) + 7},
        Case{39996, 1, 0.25f, 7, 123}, Case{40000, 0, 1.0f, 8, 0}}) {
    SCOPED_TRACE("n " + std::to_string(c.n) + " skip " + std::to_string(c.skip) + " p " +
                 std::to_string(c.p));
    std::vector<float> want(static_cast<size_t>(c.n));
    cpu::dropout_forward(want.data(), x.data() + c.skip, c.n, c.p, c.seed, c.offset);
    Tensor gx = up(x), gy = dev_empty(c.n + c.skip);
    cuda::dropout(fp(gy) + c.skip, fp(gx) + c.skip, c.n, c.p, c.seed, c.offset, stream());
    const std::vector<float> got = gy.to_vector();
    EXPECT_EQ(0, std::memcmp(got.data() + c.skip, want.data(), want.size() * sizeof(float)));
    cuda::dropout(fp(gx) + c.skip, fp(gx) + c.skip, c.n, c.p, c.seed, c.offset, stream());
    const std::vector<float> in_place = gx.to_vector();
    EXPECT_EQ(0, std::memcmp(in_place.data() + c.skip, want.data(), want.size() * sizeof(float)));
  }
}

// Autocast's half activations: a half input (a half product's output), a half output, a half
// output gradient and a half input gradient, each computed in f32 and rounded once: the f32
// kernel's results on the rounded inputs, rounded; vectorised (n a multiple of four) and not.
TEST_F(CudaOps, GeluReadsAndWritesHalfActivationsAndGradients) {
  for (DType half : {DType::bf16, DType::f16}) {
    for (const int64_t n : {int64_t{100000}, int64_t{100003}}) {
      SCOPED_TRACE(std::string(dtype_name(half)) + " n " + std::to_string(n));
      const auto xr = rounded(random_floats(static_cast<size_t>(n), 84, -6.0f, 6.0f), half);
      const auto gr = rounded(random_floats(static_cast<size_t>(n), 85), half);
      Tensor gx = up(xr), gdout = up(gr), gy = dev_empty(n), gdx = dev_empty(n);
      cuda::gelu_forward(fp(gy), DType::f32, fp(gx), DType::f32, n, stream());
      cuda::gelu_backward(fp(gdx), DType::f32, fp(gx), DType::f32, fp(gdout), DType::f32, n,
                          stream());
      const Tensor hx = gx.to(half), hdout = gdout.to(half);
      Tensor hy = Tensor::empty({n}, half, Device::cuda(0)),
             hdx = Tensor::empty({n}, half, Device::cuda(0));
      cuda::gelu_forward(hy.data_ptr(), half, hx.data_ptr(), half, n, stream());
      cuda::gelu_backward(hdx.data_ptr(), half, hx.data_ptr(), half, hdout.data_ptr(), half, n,
                          stream());
      EXPECT_EQ(hy.to(DType::f32).to_vector(), gy.to(half).to(DType::f32).to_vector());
      EXPECT_EQ(hdx.to(DType::f32).to_vector(), gdx.to(half).to(DType::f32).to_vector());
      // Half input, f32 output: the f32 kernel's bits.
      Tensor fy = dev_empty(n);
      cuda::gelu_forward(fp(fy), DType::f32, hx.data_ptr(), half, n, stream());
      EXPECT_EQ(fy.to_vector(), gy.to_vector());
    }
  }
}

// Autocast's GELU: the input rounded in the forward's pass, exactly as a cast rounds it, the
// forward and the backward computed on the rounded values; vectorised (n a multiple of four) and
// not.
TEST_F(CudaOps, GeluOnHalfInputsKeepsTheRoundedCopy) {
  for (DType half : {DType::bf16, DType::f16}) {
    for (const int64_t n : {int64_t{100000}, int64_t{100003}}) {
      SCOPED_TRACE(std::string(dtype_name(half)) + " n " + std::to_string(n));
      const auto x = random_floats(static_cast<size_t>(n), 82, -6.0f, 6.0f);
      const auto dout = random_floats(x.size(), 83);
      const auto xr = rounded(x, half);
      std::vector<float> y(x.size()), dx(x.size());
      cpu::gelu_forward(y.data(), xr.data(), n);
      cpu::gelu_backward(dx.data(), xr.data(), dout.data(), n);
      Tensor gx = up(x), gdout = up(dout), gy = dev_empty(n), gdx = dev_empty(n);
      Tensor gh = Tensor::empty({n}, half, Device::cuda(0));
      cuda::gelu_forward_half(fp(gy), DType::f32, gh.data_ptr(), fp(gx), half, n, stream());
      cuda::gelu_backward(fp(gdx), DType::f32, gh.data_ptr(), half, fp(gdout), DType::f32, n,
                          stream());
      EXPECT_EQ(gh.to(DType::f32).to_vector(), xr);
      EXPECT_TRUE(all_close(gy.to_vector(), y, 1e-5, 1e-6));
      EXPECT_TRUE(all_close(gdx.to_vector(), dx, 1e-5, 1e-6));
      // The output rounded too (for a half product): within one rounding of the f32 one's.
      Tensor gyh = Tensor::empty({n}, half, Device::cuda(0));
      cuda::gelu_forward_half(gyh.data_ptr(), half, gh.data_ptr(), fp(gx), half, n, stream());
      EXPECT_EQ(gyh.to(DType::f32).to_vector(), gy.to(half).to(DType::f32).to_vector());
    }
  }
}

// Rows beyond one chunk of the column sums (128 rows): partial sums per chunk, added in order.
TEST_F(CudaOps, ColumnSumsOverManyRowChunks) {
  const int64_t N = 1000, C = 70;
  const auto a = random_floats(static_cast<size_t>(N * C), 96);
  const auto x = random_floats(static_cast<size_t>(N * C), 97);
  std::vector<float> want(static_cast<size_t>(C), 0.5f);
  cpu::sum_first_dim(want.data(), a.data(), N, C, true);
  Tensor da = up(a), out = up(std::vector<float>(static_cast<size_t>(C), 0.5f));
  cuda::column_sum_accumulate(fp(out), fp(da), N, C, stream());
  EXPECT_TRUE(all_close(out.to_vector(), want, 1e-5, 1e-5));
  Tensor again = up(std::vector<float>(static_cast<size_t>(C), 0.5f));
  cuda::column_sum_accumulate(fp(again), fp(da), N, C, stream());
  EXPECT_EQ(again.to_vector(), out.to_vector()) << "the same bits on every run";
  // A half gradient (autocast's bias gradient) is widened as read, summed in f32.
  for (DType half : {DType::bf16, DType::f16}) {
    const auto ar = rounded(a, half);
    std::vector<float> want_half(static_cast<size_t>(C), 0.5f);
    cpu::sum_first_dim(want_half.data(), ar.data(), N, C, true);
    Tensor dh = up(ar).to(half), out_half = up(std::vector<float>(static_cast<size_t>(C), 0.5f));
    cuda::column_sum_accumulate(fp(out_half), dh.data_ptr(), half, N, C, stream());
    EXPECT_TRUE(all_close(out_half.to_vector(), want_half, 1e-5, 1e-5)) << dtype_name(half);
  }
  // LayerNorm's parameter gradients take the same path.
  std::vector<float> y(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
      dx(x.size()), dw(static_cast<size_t>(C), 0.0f), db(static_cast<size_t>(C), 0.0f);
  const auto w = random_floats(static_cast<size_t>(C), 98);
  cpu::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                          1e-5f);
  cpu::layer_norm_backward(dx.data(), dw.data(), db.data(), a.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
  Tensor gx = up(x), gw = up(w), gmean = up(mean), grstd = up(rstd), gdx = dev_empty(N * C),
         gdw = up(std::vector<float>(static_cast<size_t>(C), 0.0f)),
         gdb = up(std::vector<float>(static_cast<size_t>(C), 0.0f));
  cuda::layer_norm_backward(fp(gdx), fp(gdw), fp(gdb), fp(da), DType::f32, fp(gx), fp(gw),
                            fp(gmean), fp(grstd), N, C, stream());
  EXPECT_TRUE(all_close(gdx.to_vector(), dx, 1e-4, 1e-5));
  EXPECT_TRUE(all_close(gdw.to_vector(), dw, 1e-4, 1e-4));
  EXPECT_TRUE(all_close(gdb.to_vector(), db, 1e-4, 1e-4));
}

// The backward sums the parameter gradients beside the input gradient while a block's rows fit
// its shared memory (C <= 1536), and in a separate column-sum pass beyond: both against the CPU,
// many row chunks each, and the same bits on every run.
TEST_F(CudaOps, LayerNormBackwardOfNarrowAndWideRows) {
  for (const int64_t C : {int64_t{768}, int64_t{1536}, int64_t{1600}}) {
    SCOPED_TRACE("C " + std::to_string(C));
    const int64_t N = 301;
    const auto x = random_floats(static_cast<size_t>(N * C), 170, -2.0f, 3.0f);
    const auto w = random_floats(static_cast<size_t>(C), 171);
    const auto dout = random_floats(static_cast<size_t>(N * C), 172);
    std::vector<float> y(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
        dx(x.size()), dw(static_cast<size_t>(C), 0.0f), db(static_cast<size_t>(C), 0.0f);
    cpu::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), nullptr, N, C,
                            1e-5f);
    cpu::layer_norm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                             mean.data(), rstd.data(), N, C);
    Tensor gx = up(x), gw = up(w), gmean = up(mean), grstd = up(rstd), gdout = up(dout);
    std::vector<std::vector<float>> runs;
    // The parameter gradients are written, not added to: NaN beforehand.
    const std::vector<float> nans(static_cast<size_t>(C), std::numeric_limits<float>::quiet_NaN());
    for (int run = 0; run < 2; ++run) {
      Tensor gdx = dev_empty(N * C), gdw = up(nans), gdb = up(nans);
      cuda::layer_norm_backward(fp(gdx), fp(gdw), fp(gdb), fp(gdout), DType::f32, fp(gx), fp(gw),
                                fp(gmean), fp(grstd), N, C, stream());
      EXPECT_TRUE(all_close(gdx.to_vector(), dx, 1e-4, 1e-5));
      EXPECT_TRUE(all_close(gdw.to_vector(), dw, 1e-4, 1e-4));
      EXPECT_TRUE(all_close(gdb.to_vector(), db, 1e-4, 1e-4));
      runs.push_back(gdw.to_vector());
    }
    EXPECT_EQ(runs[0], runs[1]);
    // No rows: the parameter gradients are zeros, written.
    {
      Tensor zdw = up(nans), zdb = up(nans), zdx = dev_empty(1);
      cuda::layer_norm_backward(fp(zdx), fp(zdw), fp(zdb), fp(gdout), DType::f32, fp(gx), fp(gw),
                                fp(gmean), fp(grstd), 0, C, stream());
      EXPECT_EQ(zdw.to_vector(), std::vector<float>(static_cast<size_t>(C), 0.0f));
      EXPECT_EQ(zdb.to_vector(), std::vector<float>(static_cast<size_t>(C), 0.0f));
    }
    // Parameter gradients alone (no input gradient asked for).
    Tensor gdw = up(nans);
    cuda::layer_norm_backward(nullptr, fp(gdw), nullptr, fp(gdout), DType::f32, fp(gx), fp(gw),
                              fp(gmean), fp(grstd), N, C, stream());
    EXPECT_TRUE(all_close(gdw.to_vector(), dw, 1e-4, 1e-4));
    // The input gradient added to a gradient summed already (the residual stream's): the bits of
    // writing it and adding apart, in the fused kernel and the two-kernel path alike; and with no
    // parameter gradients (the input gradient's own kernel).
    const auto prior = random_floats(static_cast<size_t>(N * C), 173);
    const Tensor fresh = dev_empty(N * C);
    cuda::layer_norm_backward(fp(fresh), nullptr, nullptr, fp(gdout), DType::f32, fp(gx), fp(gw),
                              fp(gmean), fp(grstd), N, C, stream());
    std::vector<float> apart = fresh.to_vector();
    for (size_t i = 0; i < apart.size(); ++i) apart[i] = prior[i] + apart[i];
    for (const bool params : {true, false}) {
      Tensor summed = up(prior), pw = up(std::vector<float>(static_cast<size_t>(C), 0.0f));
      cuda::layer_norm_backward(fp(summed), params ? fp(pw) : nullptr, nullptr, fp(gdout),
                                DType::f32, fp(gx), fp(gw), fp(gmean), fp(grstd), N, C, stream(),
                                true);
      EXPECT_EQ(summed.to_vector(), apart) << "parameter gradients too: " << params;
      // With a half copy written beside it (for the half product the gradient goes to): the
      // same sum, and the copy is its cast bit for bit, summed or written afresh.
      for (const DType half : {DType::bf16, DType::f16})
        for (const bool accumulate : {true, false}) {
          SCOPED_TRACE(std::string(dtype_name(half)) + (accumulate ? " summed" : " fresh"));
          Tensor into = accumulate ? up(prior) : dev_empty(N * C);
          Tensor copy = Tensor::empty({N * C}, half, Device::cuda(0));
          cuda::layer_norm_backward(fp(into), params ? fp(pw) : nullptr, nullptr, fp(gdout),
                                    DType::f32, fp(gx), fp(gw), fp(gmean), fp(grstd), N, C,
                                    stream(), accumulate, copy.data_ptr(), half);
          EXPECT_EQ(into.to_vector(), accumulate ? apart : fresh.to_vector());
          EXPECT_EQ(copy.to(DType::f32).to_vector(), into.to(half).to(DType::f32).to_vector());
        }
    }
  }
}

TEST_F(CudaOps, LayerNormForwardBackward) {
  const int64_t N = 67, C = 200;
  const auto x = random_floats(static_cast<size_t>(N * C), 90, -2.0f, 3.0f);
  const auto w = random_floats(static_cast<size_t>(C), 91);
  const auto b = random_floats(static_cast<size_t>(C), 92);
  const auto dout = random_floats(static_cast<size_t>(N * C), 93);
  std::vector<float> y(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N)),
      dx(x.size());
  // The CPU adds the parameter gradients into zeros; the device writes them over whatever was
  // there (NaN here, so a kernel that added would show).
  std::vector<float> dw(static_cast<size_t>(C), 0.0f), db(static_cast<size_t>(C), 0.0f);
  const std::vector<float> nans(static_cast<size_t>(C), std::numeric_limits<float>::quiet_NaN());
  Tensor gdw = up(nans), gdb = up(nans);
  cpu::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, C,
                          1e-5f);
  cpu::layer_norm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w.data(),
                           mean.data(), rstd.data(), N, C);
  Tensor gx = up(x), gw = up(w), gb = up(b), gdout = up(dout), gy = dev_empty(N * C),
         gmean = dev_empty(N), grstd = dev_empty(N), gdx = dev_empty(N * C);
  cuda::layer_norm_forward(fp(gy), DType::f32, fp(gmean), fp(grstd), fp(gx), fp(gw), fp(gb), N, C,
                           1e-5f, stream());
  // The output rounded once (for a half product): the f32 output's bits rounded.
  for (DType half : {DType::bf16, DType::f16}) {
    Tensor gyh = Tensor::empty({N * C}, half, Device::cuda(0));
    cuda::layer_norm_forward(gyh.data_ptr(), half, nullptr, nullptr, fp(gx), fp(gw), fp(gb), N, C,
                             1e-5f, stream());
    EXPECT_EQ(gyh.to(DType::f32).to_vector(), gy.to(half).to(DType::f32).to_vector())
        << dtype_name(half);
  }
  cuda::layer_norm_backward(fp(gdx), fp(gdw), fp(gdb), fp(gdout), DType::f32, fp(gx), fp(gw),
                            fp(gmean), fp(grstd), N, C, stream());
  // A half output's gradient is half: widened as read, the f32 kernel's bits on those values.
  for (DType half : {DType::bf16, DType::f16}) {
    const Tensor gr = up(rounded(dout, half)), hdout = gr.to(half);
    Tensor fdx = dev_empty(N * C), hdx = dev_empty(N * C),
           fdw = up(std::vector<float>(static_cast<size_t>(C), 0.0f)),
           hdw = up(std::vector<float>(static_cast<size_t>(C), 0.0f)),
           fdb = up(std::vector<float>(static_cast<size_t>(C), 0.0f)),
           hdb = up(std::vector<float>(static_cast<size_t>(C), 0.0f));
    cuda::layer_norm_backward(fp(fdx), fp(fdw), fp(fdb), fp(gr), DType::f32, fp(gx), fp(gw),
                              fp(gmean), fp(grstd), N, C, stream());
    cuda::layer_norm_backward(fp(hdx), fp(hdw), fp(hdb), hdout.data_ptr(), half, fp(gx), fp(gw),
                              fp(gmean), fp(grstd), N, C, stream());
    EXPECT_EQ(hdx.to_vector(), fdx.to_vector()) << dtype_name(half);
    EXPECT_EQ(hdw.to_vector(), fdw.to_vector()) << dtype_name(half);
    EXPECT_EQ(hdb.to_vector(), fdb.to_vector()) << dtype_name(half);
  }
  EXPECT_TRUE(all_close(gy.to_vector(), y, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(gmean.to_vector(), mean, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(grstd.to_vector(), rstd, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(gdx.to_vector(), dx, 1e-4, 1e-5));
  EXPECT_TRUE(all_close(gdw.to_vector(), dw, 1e-4, 1e-5));
  EXPECT_TRUE(all_close(gdb.to_vector(), db, 1e-4, 1e-5));
}

// Rows read four elements at a time (V a multiple of four) and one at a time.
TEST_F(CudaOps, CrossEntropyForwardBackwardWithIgnoredRows) {
  for (const int64_t V : {int64_t{1000}, int64_t{1001}}) {
    SCOPED_TRACE("V " + std::to_string(V));
    const int64_t N = 50;
    const int32_t ignore = -100;
    const auto logits = random_floats(static_cast<size_t>(N * V), 100, -5.0f, 5.0f);
    auto targets = random_ints(static_cast<size_t>(N), 101, 0, static_cast<int32_t>(V - 1));
    targets[3] = targets[17] = targets[49] = ignore;
    std::vector<float> losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N)),
        dlogits(logits.size());
    const float mean = cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                                  targets.data(), N, V, ignore);
    cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 1.3f, N,
                                V, ignore);
    const int64_t count = cpu::cross_entropy_count(targets.data(), N, ignore);
    Tensor gl = up(logits), gt = up(targets), glosses = dev_empty(N), glse = dev_empty(N),
           gmean = dev_empty(1), gd = dev_empty(N * V);
    cuda::cross_entropy_forward(fp(glosses), fp(glse), fp(gmean), fp(gl), DType::f32, ip(gt), N, V,
                                ignore, stream());
    Tensor gdloss = up(std::vector<float>{1.3f}), gscale = dev_empty(1);
    cuda::cross_entropy_backward(fp(gd), fp(gl), DType::f32, fp(glse), ip(gt), fp(gdloss),
                                 fp(gscale), N, V, ignore, stream());
    EXPECT_EQ(gscale.item(), 1.3f / static_cast<float>(count)) << "counted on the device";
    EXPECT_TRUE(all_close(glosses.to_vector(), losses, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(glse.to_vector(), lse, 1e-6, 1e-5));
    EXPECT_NEAR(gmean.item(), mean, 1e-5 * std::abs(mean) + 1e-6);
    EXPECT_TRUE(all_close(gd.to_vector(), dlogits, 1e-4, 1e-8));
    // A target outside the vocabulary cannot throw in a kernel: that row's loss is NaN.
    targets[5] = static_cast<int32_t>(V);
    Tensor bad = up(targets);
    cuda::cross_entropy_forward(fp(glosses), fp(glse), nullptr, fp(gl), DType::f32, ip(bad), N, V,
                                ignore, stream());
    const auto l = glosses.to_vector();
    EXPECT_TRUE(std::isnan(l[5]));
    EXPECT_FALSE(std::isnan(l[6]));
  }
}

// Label smoothing (PyTorch's, the CPU's): the loss adds eps * (lse - the row's mean) and every
// gradient eps / V, on both ways of reading a row, in the backward and in the forward that writes
// the gradient with the loss; the same losses either way.
TEST_F(CudaOps, CrossEntropyWithLabelSmoothingFollowsTheCpu) {
  for (const int64_t V : {int64_t{1000}, int64_t{1001}}) {
    SCOPED_TRACE("V " + std::to_string(V));
    const int64_t N = 40;
    const int32_t ignore = -100;
    const float eps = 0.1f;
    const auto logits = random_floats(static_cast<size_t>(N * V), 102, -5.0f, 5.0f);
    auto targets = random_ints(static_cast<size_t>(N), 103, 0, static_cast<int32_t>(V - 1));
    targets[7] = ignore;
    std::vector<float> losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N)),
        dlogits(logits.size());
    const float mean = cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                                  targets.data(), N, V, ignore, eps);
    cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.8f, N,
                                V, ignore, eps);
    Tensor gl = up(logits), gt = up(targets), glosses = dev_empty(N), glse = dev_empty(N),
           gmean = dev_empty(1), gd = dev_empty(N * V), gscale = dev_empty(1);
    cuda::cross_entropy_forward(fp(glosses), fp(glse), fp(gmean), fp(gl), DType::f32, ip(gt), N, V,
                                ignore, stream(), nullptr, nullptr, eps);
    Tensor gdloss = up(std::vector<float>{0.8f});
    cuda::cross_entropy_backward(fp(gd), fp(gl), DType::f32, fp(glse), ip(gt), fp(gdloss),
                                 fp(gscale), N, V, ignore, stream(), eps);
    EXPECT_TRUE(all_close(glosses.to_vector(), losses, 1e-5, 1e-5));
    EXPECT_NEAR(gmean.item(), mean, 1e-5 * std::abs(mean) + 1e-6);
    EXPECT_TRUE(all_close(gd.to_vector(), dlogits, 1e-4, 1e-8));
    // The forward that writes the gradient (dloss = 1) keeps the losses' bits.
    std::vector<float> dlogits_one(logits.size());
    cpu::cross_entropy_backward(dlogits_one.data(), logits.data(), lse.data(), targets.data(), 1.0f,
                                N, V, ignore, eps);
    Tensor glosses2 = dev_empty(N), gd2 = dev_empty(N * V);
    cuda::cross_entropy_forward(fp(glosses2), fp(glse), nullptr, fp(gl), DType::f32, ip(gt), N, V,
                                ignore, stream(), fp(gd2), fp(gscale), eps);
    EXPECT_EQ(glosses2.to_vector(), glosses.to_vector());
    EXPECT_TRUE(all_close(gd2.to_vector(), dlogits_one, 1e-4, 1e-8));
  }
  EXPECT_THROW(cuda::cross_entropy_backward(nullptr, nullptr, DType::f32, nullptr, nullptr, nullptr,
                                            nullptr, 1, 4, -100, stream(), 1.0f),
               Error);
}

// Logits of -infinity (a masked vocabulary) add nothing to a row's sum and get no gradient, on
// both ways of reading a row, in f32 and bf16.
TEST_F(CudaOps, CrossEntropyOverMaskedLogits) {
  const int64_t N = 9;
  for (const int64_t V : {int64_t{400}, int64_t{401}}) {
    for (DType type : {DType::f32, DType::bf16}) {
      SCOPED_TRACE("V " + std::to_string(V) + " " + std::string(dtype_name(type)));
      auto logits = random_floats(static_cast<size_t>(N * V), 130, -4.0f, 4.0f);
      auto targets = random_ints(static_cast<size_t>(N), 131, 0, static_cast<int32_t>(V - 1));
      for (int64_t n = 0; n < N; ++n)
        for (int64_t v = 0; v < V; ++v)
          if ((v * 7 + n) % 3 == 0 && v != targets[static_cast<size_t>(n)])
            logits[static_cast<size_t>(n * V + v)] = -INFINITY;
      if (type != DType::f32)
        logits = autograd::round_to(Tensor::from_vector(logits, {N, V}), type).to_vector();
      std::vector<float> losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N)),
          dlogits(logits.size());
      cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(), N, V,
                                 -1);
      cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 1.0f,
                                  N, V, -1);
      Tensor gl = up(logits).to(type), gt = up(targets), glosses = dev_empty(N),
             glse = dev_empty(N), gd = Tensor::empty({N * V}, type, Device::cuda(0));
      cuda::cross_entropy_forward(fp(glosses), fp(glse), nullptr, gl.data_ptr(), type, ip(gt), N, V,
                                  -1, stream());
      Tensor gdloss = up(std::vector<float>{1.0f}), gscale = dev_empty(1);
      cuda::cross_entropy_backward(gd.data_ptr(), gl.data_ptr(), type, fp(glse), ip(gt), fp(gdloss),
                                   fp(gscale), N, V, -1, stream());
      EXPECT_TRUE(all_close(glosses.to_vector(), losses, 1e-5, 1e-5));
      EXPECT_TRUE(all_close(glse.to_vector(), lse, 1e-6, 1e-5));
      const auto got = gd.to(DType::f32).to_vector();
      for (size_t i = 0; i < got.size(); ++i) {
        if (logits[i] == -INFINITY) {
          EXPECT_EQ(got[i], 0.0f) << i;
        }
      }
      EXPECT_TRUE(all_close(got, dlogits, type == DType::f32 ? 1e-4 : 1.0 / 128, 1e-7));
      // A NaN logit makes its row's loss NaN, even at the start of a row (before any finite
      // maximum) and four of them read together; the other rows keep theirs.
      for (int64_t v = 0; v < 4; ++v)
        logits[static_cast<size_t>(v)] = std::numeric_limits<float>::quiet_NaN();
      targets[0] = 5;
      Tensor gnan = up(logits).to(type), gt0 = up(targets);
      cuda::cross_entropy_forward(fp(glosses), fp(glse), nullptr, gnan.data_ptr(), type, ip(gt0), N,
                                  V, -1, stream());
      const auto l = glosses.to_vector();
      EXPECT_TRUE(std::isnan(l[0]));
      EXPECT_FALSE(std::isnan(l[1]));
      // A lane that read only NaNs (column 16 read alone, or columns 64-67 read as one quad) has
      // no finite maximum: its NaN must still reach the row (it was once dropped when merged);
      // so must a row of NaNs only.
      for (const int64_t v : {16, 64, 65, 66, 67})
        logits[static_cast<size_t>(2 * V + v)] = std::numeric_limits<float>::quiet_NaN();
      for (int64_t v = 0; v < V; ++v)
        logits[static_cast<size_t>(4 * V + v)] = std::numeric_limits<float>::quiet_NaN();
      Tensor glanes = up(logits).to(type);
      cuda::cross_entropy_forward(fp(glosses), fp(glse), nullptr, glanes.data_ptr(), type, ip(gt0),
                                  N, V, -1, stream());
      const auto lanes = glse.to_vector();
      EXPECT_TRUE(std::isnan(lanes[2]));
      EXPECT_TRUE(std::isnan(lanes[4]));
      EXPECT_FALSE(std::isnan(lanes[3]));
    }
  }
}

// Half logits (autocast's LM head) are widened as read, and the gradient, written over them in
// place, is the f32 kernel's rounded once: against the CPU on the same rounded values.
TEST_F(CudaOps, CrossEntropyOnHalfLogitsWritesItsGradientInPlace) {
  const int64_t N = 37;
  const int32_t ignore = -1;
  for (const int64_t V : {int64_t{1003}, int64_t{1004}})
    for (DType half : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(dtype_name(half)) + " V " + std::to_string(V));
      auto logits = random_floats(static_cast<size_t>(N * V), 120, -6.0f, 6.0f);
      auto targets = random_ints(static_cast<size_t>(N), 121, 0, static_cast<int32_t>(V - 1));
      targets[4] = ignore;
      const Tensor rounded = autograd::round_to(Tensor::from_vector(logits, {N, V}), half);
      logits = rounded.to_vector();
      std::vector<float> losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N)),
          dlogits(logits.size());
      const float mean = cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(),
                                                    targets.data(), N, V, ignore);
      cpu::cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(), 0.7f,
                                  N, V, ignore);
      Tensor gl = up(logits).to(half), gt = up(targets), glosses = dev_empty(N),
             glse = dev_empty(N), gmean = dev_empty(1);
      cuda::cross_entropy_forward(fp(glosses), fp(glse), fp(gmean), gl.data_ptr(), half, ip(gt), N,
                                  V, ignore, stream());
      Tensor gdloss = up(std::vector<float>{0.7f}), gscale = dev_empty(1);
      cuda::cross_entropy_backward(gl.data_ptr(), gl.data_ptr(), half, fp(glse), ip(gt), fp(gdloss),
                                   fp(gscale), N, V, ignore, stream());
      EXPECT_TRUE(all_close(glosses.to_vector(), losses, 1e-5, 1e-5));
      EXPECT_TRUE(all_close(glse.to_vector(), lse, 1e-6, 1e-5));
      EXPECT_NEAR(gmean.item(), mean, 1e-5 * std::abs(mean) + 1e-6);
      // One rounding of a value within f32's error of the CPU's: at most one half ulp apart.
      const auto want = autograd::round_to(Tensor::from_vector(dlogits, {N, V}), half).to_vector();
      const auto got = gl.to(DType::f32).to_vector();
      // (f16's subnormals, below 6.1e-5, are 6e-8 apart.)
      const double ulp = half == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
      EXPECT_TRUE(all_close(got, want, ulp, 1e-7));
    }
}

// The forward that also writes the gradient of the mean loss (the LM head's under autocast):
// the same losses, log-sum-exps and mean as the forward alone, and the backward kernel's gradient
// for dloss = 1 bit for bit, written over the logits or beside them; ignored rows get zeros, a
// bad target NaNs.
TEST_F(CudaOps, CrossEntropyForwardWritesTheBackwardsGradient) {
  const int64_t N = 41;
  const int32_t ignore = -1;
  // Bit for bit, NaNs too (a bad target's row).
  const auto same_bits = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  for (const int64_t V : {int64_t{1003}, int64_t{1004}, int64_t{50304}})
    for (DType type : {DType::bf16, DType::f16, DType::f32}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " V " + std::to_string(V));
      const auto logits = random_floats(static_cast<size_t>(N * V), 122, -6.0f, 6.0f);
      auto targets = random_ints(static_cast<size_t>(N), 123, 0, static_cast<int32_t>(V - 1));
      targets[4] = ignore;
      targets[7] = static_cast<int32_t>(V);  // out of range
      const Tensor gt = up(targets), src = up(logits).to(type);
      Tensor losses = dev_empty(N), lse = dev_empty(N), mean = dev_empty(1);
      cuda::cross_entropy_forward(fp(losses), fp(lse), fp(mean), src.data_ptr(), type, ip(gt), N, V,
                                  ignore, stream());
      Tensor want = Tensor::empty({N * V}, type, Device::cuda(0));
      Tensor one = up(std::vector<float>{1.0f}), scale = dev_empty(1);
      cuda::cross_entropy_backward(want.data_ptr(), src.data_ptr(), type, fp(lse), ip(gt), fp(one),
                                   fp(scale), N, V, ignore, stream());
      // Beside them one element off 16-byte alignment too: the gradient is then written one
      // element at a time, but the loss must still be read the forward's way (its bits).
      for (const int where : {0, 1, 2}) {
        SCOPED_TRACE(where == 0 ? "over the logits" : where == 1 ? "beside them" : "unaligned");
        Tensor x = src.clone();
        Tensor d = where == 0 ? x : Tensor::empty({N * V + (where == 2)}, type, Device::cuda(0));
        void* dp = static_cast<char*>(d.data_ptr()) + (where == 2 ? dtype_size(type) : 0);
        Tensor l2 = dev_empty(N), lse2 = dev_empty(N), mean2 = dev_empty(1), s2 = dev_empty(1);
        cuda::cross_entropy_forward(fp(l2), fp(lse2), fp(mean2), x.data_ptr(), type, ip(gt), N, V,
                                    ignore, stream(), dp, fp(s2));
        EXPECT_TRUE(same_bits(l2.to_vector(), losses.to_vector()));
        EXPECT_TRUE(same_bits(lse2.to_vector(), lse.to_vector()));
        EXPECT_TRUE(same_bits(mean2.to_vector(), mean.to_vector()));
        auto got = d.to(DType::f32).to_vector();
        if (where == 2) got.erase(got.begin());
        const auto ref = want.to(DType::f32).to_vector();
        EXPECT_TRUE(same_bits(got, ref));
        for (int64_t v = 0; v < V; ++v) {
          ASSERT_EQ(got[static_cast<size_t>(4 * V + v)], 0.0f) << v;
          ASSERT_TRUE(std::isnan(got[static_cast<size_t>(7 * V + v)])) << v;
        }
      }
    }
}

TEST_F(CudaOps, AdamWStepsMatch) {
  const int64_t n = 10007;
  auto p = random_floats(static_cast<size_t>(n), 110);
  std::vector<float> m(static_cast<size_t>(n), 0.0f), v(static_cast<size_t>(n), 0.0f);
  Tensor gp = up(p), gm = up(m), gv = up(v);
  for (int64_t t = 1; t <= 3; ++t) {
    const auto g = random_floats(static_cast<size_t>(n), 111 + static_cast<uint64_t>(t));
    Tensor gg = up(g);
    cpu::adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t);
    cuda::adamw_step(fp(gp), fp(gg), fp(gm), fp(gv), n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, t,
                     stream());
  }
  // The CPU's bits: every product and sum rounded on its own on both sides (a multiply-add fused
  // by one compiler and not the other would differ in a third of the elements).
  EXPECT_EQ(gp.to_vector(), p);
  EXPECT_EQ(gm.to_vector(), m);
  EXPECT_EQ(gv.to_vector(), v);
}

// SGD with momentum (with and without dampening), Nesterov and weight decay: the CPU's bits over
// three steps.
TEST_F(CudaOps, SgdStepsHaveTheCpusBits) {
  const int64_t n = 10007;
  for (const float dampening : {0.0f, 0.1f})
    for (const bool nesterov : {false, true}) {
      if (nesterov && dampening != 0.0f) continue;
      SCOPED_TRACE(std::to_string(dampening) + (nesterov ? " nesterov" : ""));
      auto p = random_floats(static_cast<size_t>(n), 112);
      std::vector<float> buf(static_cast<size_t>(n), 0.0f);
      Tensor gp = up(p), gbuf = up(buf);
      for (int64_t t = 1; t <= 3; ++t) {
        const auto g = random_floats(static_cast<size_t>(n), 113 + static_cast<uint64_t>(t));
        Tensor gg = up(g);
        cpu::sgd_step(p.data(), g.data(), buf.data(), n, 0.05f, 0.9f, dampening, 1e-2f, nesterov,
                      t == 1);
        cuda::sgd_step(fp(gp), fp(gg), fp(gbuf), n, 0.05f, 0.9f, dampening, 1e-2f, nesterov, t == 1,
                       stream());
      }
      EXPECT_EQ(gp.to_vector(), p);
      EXPECT_EQ(gbuf.to_vector(), buf);
    }
}

// The multi-tensor step gives every element the bits of the one-tensor step: more tensors than
// one launch takes, tensors over one block's chunk, an empty one, two weight decays.
TEST_F(CudaOps, AdamWManyTensorsMatchesOneAtATime) {
  std::vector<int64_t> ns;
  for (int i = 0; i < 60; ++i) ns.push_back(i == 7 ? 0 : (i % 5 == 0 ? 70001 : 1 + 37 * i));
  std::vector<Tensor> p1, p2, g, m1, m2, v1, v2;
  std::vector<float> decays;
  for (size_t i = 0; i < ns.size(); ++i) {
    const auto init = random_floats(static_cast<size_t>(ns[i]) + 1, 200 + i);
    const std::vector<float> pv(init.begin(), init.end() - 1);
    p1.push_back(up(pv));
    p2.push_back(up(pv));
    g.push_back(up(random_floats(static_cast<size_t>(ns[i]) + 1, 300 + i)));
    for (auto* list : {&m1, &m2, &v1, &v2})
      list->push_back(up(std::vector<float>(static_cast<size_t>(ns[i]), 0.0f)));
    decays.push_back(i % 2 ? 0.1f : 0.0f);
  }
  for (int64_t t = 1; t <= 2; ++t) {
    // The second step clipped: the many-tensor kernel reads the factor with each gradient, which
    // has the bits of scaling the gradient first.
    const float clip = t == 2 ? 0.37f : 1.0f;
    std::vector<float*> pp, mm, vv;
    std::vector<const float*> gg;
    for (size_t i = 0; i < ns.size(); ++i) {
      Tensor scaled = dev_empty(ns[i]);
      cuda::scale(fp(scaled), fp(g[i]), clip, ns[i], stream());
      cuda::adamw_step(fp(p1[i]), fp(scaled), fp(m1[i]), fp(v1[i]), ns[i], 1e-3f, 0.9f, 0.95f,
                       1e-8f, decays[i], t, stream());
      pp.push_back(fp(p2[i]));
      gg.push_back(fp(g[i]));
      mm.push_back(fp(m2[i]));
      vv.push_back(fp(v2[i]));
    }
    cuda::adamw_step_many(pp.data(), gg.data(), mm.data(), vv.data(), ns.data(), decays.data(),
                          static_cast<int64_t>(ns.size()), 1e-3f, 0.9f, 0.95f, 1e-8f, t, clip,
                          nullptr, stream());
  }
  for (size_t i = 0; i < ns.size(); ++i) {
    EXPECT_EQ(p2[i].to_vector(), p1[i].to_vector()) << "tensor " << i;
    EXPECT_EQ(m2[i].to_vector(), m1[i].to_vector()) << "tensor " << i;
    EXPECT_EQ(v2[i].to_vector(), v1[i].to_vector()) << "tensor " << i;
  }
}

// Bytes to the device: doubles, or a step gate.
template <typename T>
Tensor up_bytes(const std::vector<T>& v) {
  Tensor host = Tensor::empty({static_cast<int64_t>(v.size() * sizeof(T))}, DType::u8);
  if (!v.empty()) std::memcpy(host.data_ptr(), v.data(), v.size() * sizeof(T));
  return host.to(kDev);
}

// A gated multi-tensor step over more tensors than one launch holds (60, two launches), one of
// them over a block's chunk: every launch reads the gate. Skipped, nothing changes; passed, the
// bits of the ungated step with the gate's coefficient as its gradient scale.
TEST_F(CudaOps, GatedAdamWOverSeveralLaunchesReadsTheGateInEach) {
  const int count = 60;
  std::vector<int64_t> ns;
  std::vector<float> decays;
  std::vector<Tensor> p1, p2, g, m1, m2, v1, v2;
  for (int i = 0; i < count; ++i) {
    ns.push_back(i == 5 ? 70001 : 1 + 37 * i);
    decays.push_back(i % 2 ? 0.1f : 0.0f);
    const auto pv = random_floats(static_cast<size_t>(ns.back()), 600 + i);
    const std::vector<float> zeros(static_cast<size_t>(ns.back()), 0.0f);
    p1.push_back(up(pv));
    p2.push_back(up(pv));
    g.push_back(up(random_floats(static_cast<size_t>(ns.back()), 700 + i)));
    for (auto* list : {&m1, &m2, &v1, &v2}) list->push_back(up(zeros));
  }
  auto ptrs = [](const std::vector<Tensor>& ts) {
    std::vector<float*> out;
    for (const Tensor& t : ts) out.push_back(fp(t));
    return out;
  };
  const auto gp = ptrs(g);
  const std::vector<const float*> grads(gp.begin(), gp.end());
  for (const int skip : {1, 0}) {
    SCOPED_TRACE(skip);
    cpu::StepGate gate;
    gate.coef = 0.37f;
    gate.skip = skip;
    const Tensor dgate = up_bytes(std::vector<cpu::StepGate>{gate});
    const auto pp = ptrs(p2), mm = ptrs(m2), vv = ptrs(v2);
    cuda::adamw_step_many(pp.data(), grads.data(), mm.data(), vv.data(), ns.data(), decays.data(),
                          count, 1e-3f, 0.9f, 0.95f, 1e-8f, 1, 1.0f,
                          static_cast<const cpu::StepGate*>(dgate.data_ptr()), stream());
    if (!skip) {
      const auto rp = ptrs(p1), rm = ptrs(m1), rv = ptrs(v1);
      cuda::adamw_step_many(rp.data(), grads.data(), rm.data(), rv.data(), ns.data(), decays.data(),
                            count, 1e-3f, 0.9f, 0.95f, 1e-8f, 1, 0.37f, nullptr, stream());
    }
    for (int i = 0; i < count; ++i) {
      ASSERT_EQ(p2[i].to_vector(), p1[i].to_vector()) << i;
      ASSERT_EQ(m2[i].to_vector(), m1[i].to_vector()) << i;
      ASSERT_EQ(v2[i].to_vector(), v1[i].to_vector()) << i;
    }
  }
}

// The gate of a step decided on the device has the host rule's bits (cpu::step_gate), from sums
// of squares that have sum_squares_each's bits; the multi-tensor AdamW then leaves everything as
// it was where the gate skips, and takes its coefficient as the clipping scale elsewhere.
TEST_F(CudaOps, StepGateDecidesWithTheHostsBits) {
  std::vector<Tensor> grads;
  for (int i = 0; i < 70; ++i)
    grads.push_back(up(random_floats(static_cast<size_t>(1 + 977 * (i % 7)), 400 + i)));
  std::vector<double> sums(grads.size());
  const Tensor dsums = ops::sum_squares_each_on_device(grads, kDev);
  std::memcpy(sums.data(), dsums.to(Device::cpu()).data_ptr(), sums.size() * sizeof(double));
  EXPECT_EQ(sums, ops::sum_squares_each(grads));

  const double inf = std::numeric_limits<double>::infinity();
  struct Case {
    std::vector<float> losses;
    std::vector<double> pre, sums;
    int64_t split;
    double max_norm;
  };
  std::vector<double> with_inf = sums, with_nan = sums;
  with_inf[3] = inf;
  with_nan[4] = std::nan("");
  const std::vector<Case> cases = {
      {{2.5f}, {}, sums, 0, 0.0},         {{0.1f, 0.7f, 0.3f}, {}, sums, 20, 1.0},
      {{2.5f}, {}, sums, 70, 1e6},        {{std::nanf("")}, {}, sums, 0, 1.0},
      {{2.5f}, {1.0, inf}, sums, 0, 1.0}, {{2.5f}, {1.0}, with_inf, 5, 1.0},
      {{2.5f, 1.0f}, {}, {}, 0, 1.0},     {{2.5f}, {}, with_nan, 5, 1.0},
  };
  for (size_t c = 0; c < cases.size(); ++c) {
    SCOPED_TRACE(c);
    const Case& k = cases[c];
    cpu::StepGate want;
    cpu::step_gate(&want, k.losses.data(), static_cast<int64_t>(k.losses.size()), k.pre.data(),
                   static_cast<int64_t>(k.pre.size()), k.sums.data(), k.split,
                   static_cast<int64_t>(k.sums.size()), k.max_norm, 1e-6);
    const Tensor losses = up(k.losses), pre = up_bytes(k.pre), ss = up_bytes(k.sums);
    Tensor gate = dev_empty(sizeof(cpu::StepGate), DType::u8);
    cuda::step_gate(static_cast<cpu::StepGate*>(gate.data_ptr()), fp(losses),
                    static_cast<int64_t>(k.losses.size()),
                    static_cast<const double*>(pre.data_ptr()), static_cast<int64_t>(k.pre.size()),
                    static_cast<const double*>(ss.data_ptr()), k.split,
                    static_cast<int64_t>(k.sums.size()), k.max_norm, 1e-6, stream());
    cpu::StepGate got;
    std::memcpy(&got, gate.to(Device::cpu()).data_ptr(), sizeof got);
    test::expect_same_gate(got, want);
  }

  for (const int skip : {1, 0}) {
    SCOPED_TRACE(skip);
    cpu::StepGate g;
    g.coef = 0.37f;
    g.skip = skip;
    const Tensor gate = up_bytes(std::vector<cpu::StepGate>{g});
    const std::vector<float> pv = random_floats(5000, 500), gv = random_floats(5000, 501);
    Tensor p1 = up(pv), p2 = up(pv), grad = up(gv), m1 = up(std::vector<float>(5000, 0.0f)),
           m2 = up(std::vector<float>(5000, 0.0f)), v1 = up(std::vector<float>(5000, 0.0f)),
           v2 = up(std::vector<float>(5000, 0.0f));
    const int64_t n = 5000;
    const float decay = 0.1f;
    float* pp = fp(p2);
    const float* gg = fp(grad);
    float* mm = fp(m2);
    float* vv = fp(v2);
    // The scale given by value (1) is not the one the gate gives.
    cuda::adamw_step_many(&pp, &gg, &mm, &vv, &n, &decay, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 1, 1.0f,
                          static_cast<const cpu::StepGate*>(gate.data_ptr()), stream());
    if (!skip)
      cuda::adamw_step_many(&pp, &gg, &mm, &vv, &n, &decay, 1, 1e-3f, 0.9f, 0.95f, 1e-8f, 2, 1.0f,
                            static_cast<const cpu::StepGate*>(gate.data_ptr()), stream());
    // The reference: adamw_step on the gradient scaled first (the bits the scale read with each
    // gradient gives, AdamWManyTensorsMatchesOneAtATime), or nothing where the gate skips.
    Tensor scaled = dev_empty(n);
    cuda::scale(fp(scaled), gg, 0.37f, n, stream());
    for (int64_t t = 1; t <= (skip ? 0 : 2); ++t)
      cuda::adamw_step(fp(p1), fp(scaled), fp(m1), fp(v1), n, 1e-3f, 0.9f, 0.95f, 1e-8f, decay, t,
                       stream());
    EXPECT_EQ(p2.to_vector(), p1.to_vector());
    EXPECT_EQ(m2.to_vector(), m1.to_vector());
    EXPECT_EQ(v2.to_vector(), v1.to_vector());
    if (skip) {
      EXPECT_EQ(p2.to_vector(), pv);
    }
  }
}

TEST_F(CudaOps, GptEmbeddingForwardBackward) {
  const int64_t B = 3, T = 17, C = 40, V = 50;
  const auto idx = random_ints(static_cast<size_t>(B * T), 120, 0, static_cast<int32_t>(V - 1));
  const auto wte = random_floats(static_cast<size_t>(V * C), 121);
  const auto wpe = random_floats(static_cast<size_t>(T * C), 122);
  const auto dout = random_floats(static_cast<size_t>(B * T * C), 123);
  std::vector<float> out(static_cast<size_t>(B * T * C));
  auto dwte = random_floats(wte.size(), 124);
  auto dwpe = random_floats(wpe.size(), 125);
  Tensor gdwte = up(dwte), gdwpe = up(dwpe);
  cpu::gpt_embedding_forward(out.data(), idx.data(), wte.data(), wpe.data(), B, T, C, V);
  cpu::gpt_embedding_backward(dwte.data(), dwpe.data(), dout.data(), idx.data(), B, T, C, V);
  Tensor gidx = up(idx), gwte = up(wte), gwpe = up(wpe), gdout = up(dout),
         gout = dev_empty(B * T * C);
  cuda::gpt_embedding_forward(fp(gout), ip(gidx), fp(gwte), fp(gwpe), B, T, C, V, stream());
  cuda::gpt_embedding_backward(fp(gdwte), fp(gdwpe), fp(gdout), ip(gidx), B, T, C, V, stream());
  EXPECT_TRUE(all_close(gout.to_vector(), out, 0, 0));
  EXPECT_TRUE(all_close(gdwte.to_vector(), dwte, 1e-5, 1e-6));
  EXPECT_TRUE(all_close(gdwpe.to_vector(), dwpe, 1e-5, 1e-6));
  // The token table's sums: each token's positions in order from zero, no atomics. Into a zero
  // table the CPU kernel's bits, the same on every run; into a table holding another gradient,
  // that gradient plus the sums (a separate addition's bits). Many repeats of few tokens, and an
  // out-of-range one (dropped), on a GPT-2-sized batch.
  {
    const int64_t B2 = 8, T2 = 1024, C2 = 64, V2 = 300, n = B2 * T2;
    auto many = random_ints(static_cast<size_t>(n), 126, 0, static_cast<int32_t>(V2 - 1));
    many[5] = static_cast<int32_t>(V2);
    const auto g2 = random_floats(static_cast<size_t>(n * C2), 127);
    std::vector<float> e(static_cast<size_t>(V2 * C2), 0.0f);
    for (int64_t i = 0; i < n; ++i)
      if (many[static_cast<size_t>(i)] < V2)
        for (int64_t c = 0; c < C2; ++c)
          e[static_cast<size_t>(many[static_cast<size_t>(i)] * C2 + c)] +=
              g2[static_cast<size_t>(i * C2 + c)];
    const auto prior = random_floats(e.size(), 128);
    std::vector<float> summed(e.size());
    for (size_t i = 0; i < e.size(); ++i) summed[i] = prior[i] + e[i];
    Tensor gmany = up(many), gg2 = up(g2);
    for (int run = 0; run < 2; ++run) {
      Tensor zero = up(std::vector<float>(e.size(), 0.0f)), held = up(prior);
      cuda::gpt_embedding_backward(fp(zero), nullptr, fp(gg2), ip(gmany), B2, T2, C2, V2, stream());
      cuda::gpt_embedding_backward(fp(held), nullptr, fp(gg2), ip(gmany), B2, T2, C2, V2, stream());
      EXPECT_EQ(zero.to_vector(), e) << "run " << run;
      EXPECT_EQ(held.to_vector(), summed) << "run " << run;
    }
  }
}

TEST_F(CudaOps, CausalAttentionForwardBackward) {
  const int64_t B = 2, T = 37, C = 48, NH = 3;
  const auto qkv = random_floats(static_cast<size_t>(B * T * 3 * C), 130);
  const auto dout = random_floats(static_cast<size_t>(B * T * C), 131);
  std::vector<float> out(static_cast<size_t>(B * T * C)), att(static_cast<size_t>(B * NH * T * T)),
      scratch(att.size()), dqkv(qkv.size());
  cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T, C,
                          NH);
  Tensor gqkv = up(qkv), gdout = up(dout), gout = dev_empty(B * T * C),
         gatt = dev_empty(B * NH * T * T), gscratch = dev_empty(B * NH * T * T),
         gdqkv = up(std::vector<float>(qkv.size(), std::numeric_limits<float>::quiet_NaN()));
  cuda::attention_forward(fp(gout), fp(gatt), fp(gqkv), B, T, C, NH, stream());
  cuda::attention_backward(fp(gdqkv), fp(gscratch), fp(gdout), fp(gqkv), fp(gatt), B, T, C, NH,
                           stream());
  EXPECT_TRUE(all_close(gout.to_vector(), out, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(gatt.to_vector(), att, 1e-5, 1e-6));
  // NaN-filled beforehand: every element of dqkv must have been written.
  EXPECT_TRUE(all_close(gdqkv.to_vector(), dqkv, 1e-4, 1e-5));
}

TEST_F(CudaOps, CausalAttentionOnGemmsMatchesTheCpu) {
  cuda::set_allow_tf32(false);
  for (int64_t T : {int64_t{37}, int64_t{128}}) {
    const int64_t B = 2, C = 48, NH = 3;
    const auto qkv = random_floats(static_cast<size_t>(B * T * 3 * C), 140);
    const auto dout = random_floats(static_cast<size_t>(B * T * C), 141);
    std::vector<float> out(static_cast<size_t>(B * T * C)),
        att(static_cast<size_t>(B * NH * T * T)), scratch(att.size()), dqkv(qkv.size());
    cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B, T,
                            C, NH);
    const float nan = std::numeric_limits<float>::quiet_NaN();
    Tensor gqkv = up(qkv), gdout = up(dout), gout = up(std::vector<float>(out.size(), nan)),
           gatt = up(std::vector<float>(att.size(), nan)), gscratch = dev_empty(B * NH * T * T),
           gdqkv = up(std::vector<float>(qkv.size(), nan));
    cuda::attention_forward_gemm(fp(gout), fp(gatt), fp(gqkv), B, T, C, NH, stream());
    cuda::attention_backward_gemm(fp(gdqkv), fp(gscratch), fp(gdout), fp(gqkv), fp(gatt), B, T, C,
                                  NH, stream());
    // NaN-filled beforehand: every element of out, att and dqkv must have been written.
    EXPECT_TRUE(all_close(gout.to_vector(), out, 1e-5, 1e-5)) << "T = " << T;
    EXPECT_TRUE(all_close(gatt.to_vector(), att, 1e-5, 1e-6)) << "T = " << T;
    EXPECT_TRUE(all_close(gdqkv.to_vector(), dqkv, 1e-4, 1e-5)) << "T = " << T;
  }
}

// max |got - want| <= tol * max |want|: the error of bf16 products (2^-9 relative per rounded
// operand) bounded against the size of the result, not element by element (elements near zero
// carry the absolute error of their larger neighbours).
::testing::AssertionResult close_to_scale(const std::vector<float>& got,
                                          const std::vector<float>& want, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  double scale = 0, worst = 0;
  size_t worst_i = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(err <= worst)) {  // NaN counts as the worst
      worst = std::isnan(err) ? INFINITY : err;
      worst_i = i;
    }
  }
  std::cout << "[ measured ] largest error " << worst << " against a largest value " << scale
            << "\n";
  if (worst <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "worst at " << worst_i << ": got " << got[worst_i] << ", want " << want[worst_i]
         << " (limit " << tol * scale << ")";
}

// close_to_scale for each of q, k and v of a packed [.., 3C] gradient, each against its own
// largest value (dv is several times dq and dk: one scale for all three let their errors hide).
::testing::AssertionResult close_per_part(const std::vector<float>& got,
                                          const std::vector<float>& want, int64_t C, double tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "sizes " << got.size() << " vs " << want.size();
  const char* names[] = {"dq", "dk", "dv"};
  for (int64_t part = 0; part < 3; ++part) {
    std::vector<float> g, w;
    for (size_t i = 0; i < want.size(); ++i)
      if (static_cast<int64_t>(i) % (3 * C) / C == part) {
        g.push_back(got[i]);
        w.push_back(want[i]);
      }
    if (auto r = close_to_scale(g, w, tol); !r) return r << " in " << names[part];
  }
  return ::testing::AssertionSuccess();
}

// Flash attention against the f32 reference on the same half-rounded q, k, v (so that the
// difference is only the kernels' own roundings: the probabilities and score gradients fed to
// half products), in bf16 and f16, for every supported head size and lengths on and off the
// 64-row tiles.
TEST_F(CudaOps, FlashAttentionFollowsTheReferenceWithinHalfPrecision) {
  for (const DType half : {DType::bf16, DType::f16})
    for (const int64_t HS : {int64_t{32}, int64_t{64}, int64_t{128}}) {
      for (const int64_t T : {int64_t{1}, int64_t{37}, int64_t{64}, int64_t{65}, int64_t{130},
                              int64_t{200}, int64_t{256}}) {
        SCOPED_TRACE(dtype_name(half));
        const int64_t B = 2, NH = 3, C = NH * HS;
        ASSERT_TRUE(cuda::flash_attention_supports(HS));
        // Scores spread enough that the attention is peaked (a near-uniform one mutes mistakes in
        // the masks and in which row's log-sum-exp is used).
        const double part_tol = half == DType::bf16 ? 2e-2 : 1e-2;
        const auto qkv =
            rounded(random_floats(static_cast<size_t>(B * T * 3 * C), 150 + T, -3.0f, 3.0f), half);
        const auto dout = rounded(random_floats(static_cast<size_t>(B * T * C), 151 + T), half);
        std::vector<float> out(static_cast<size_t>(B * T * C)),
            att(static_cast<size_t>(B * NH * T * T)), scratch(att.size()), dqkv(qkv.size()),
            lse(static_cast<size_t>(B * NH * T));
        cpu::attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH);
        cpu::attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), B,
                                T, C, NH);
        test::attention_lse_reference(lse.data(), qkv.data(), B, T, C, NH);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        Tensor gqkv = up(qkv), gdout = up(dout), gout = up(std::vector<float>(out.size(), nan)),
               glse = up(std::vector<float>(lse.size(), nan)), gscratch = dev_empty(B * NH * T),
               gdqkv = up(std::vector<float>(qkv.size(), nan));
        const Tensor hqkv = gqkv.to(half);
        cuda::flash_attention_forward(fp(gout), DType::f32, fp(glse), hqkv.data_ptr(), half, B, T,
                                      C, NH, stream());
        cuda::flash_attention_backward(fp(gdqkv), DType::f32, fp(gscratch), fp(gdout),
                                       hqkv.data_ptr(), half, fp(gout), DType::f32, fp(glse), B, T,
                                       C, NH, stream());
        // NaN-filled beforehand: every element must have been written.
        EXPECT_TRUE(close_to_scale(gout.to_vector(), out, 1e-2)) << "HS " << HS << " T " << T;
        EXPECT_TRUE(all_close(glse.to_vector(), lse, 1e-4, 1e-4)) << "HS " << HS << " T " << T;
        // Two fragments a warp (heads up to 64): the same products in the same order, so the same
        // bits.
        if (HS <= 64) {
          Tensor out32 = up(std::vector<float>(out.size(), nan)),
                 lse32 = up(std::vector<float>(lse.size(), nan));
          cuda::flash_attention_forward(fp(out32), DType::f32, fp(lse32), hqkv.data_ptr(), half, B,
                                        T, C, NH, stream(), 32);
          EXPECT_EQ(out32.to_vector(), gout.to_vector()) << "HS " << HS << " T " << T;
          EXPECT_EQ(lse32.to_vector(), glse.to_vector()) << "HS " << HS << " T " << T;
        }
        EXPECT_TRUE(close_per_part(gdqkv.to_vector(), dqkv, C, part_tol))
            << "HS " << HS << " T " << T;
        // The same bits on every run: no atomics.
        Tensor again = up(std::vector<float>(qkv.size(), nan));
        cuda::flash_attention_backward(fp(again), DType::f32, fp(gscratch), fp(gdout),
                                       hqkv.data_ptr(), half, fp(gout), DType::f32, fp(glse), B, T,
                                       C, NH, stream());
        EXPECT_EQ(again.to_vector(), gdqkv.to_vector()) << "HS " << HS << " T " << T;
        // dq summed with atomics in the key-side kernel's pass: dk and dv are that kernel's own
        // bits, dq the same sums in another order (and every element written).
        {
          cuda::set_flash_backward_atomic_dq(true);
          Tensor atomic = up(std::vector<float>(qkv.size(), nan));
          cuda::flash_attention_backward(fp(atomic), DType::f32, fp(gscratch), fp(gdout),
                                         hqkv.data_ptr(), half, fp(gout), DType::f32, fp(glse), B,
                                         T, C, NH, stream());
          Tensor atomic_half = up(std::vector<float>(qkv.size(), nan)).to(half);
          cuda::flash_attention_backward(atomic_half.data_ptr(), half, fp(gscratch), fp(gdout),
                                         hqkv.data_ptr(), half, fp(gout), DType::f32, fp(glse), B,
                                         T, C, NH, stream());
          cuda::set_flash_backward_atomic_dq(false);
          const auto got = atomic.to_vector(), ref = gdqkv.to_vector();
          EXPECT_TRUE(close_per_part(got, dqkv, C, part_tol)) << "HS " << HS << " T " << T;
          EXPECT_TRUE(close_per_part(atomic_half.to(DType::f32).to_vector(), dqkv, C, part_tol))
              << "HS " << HS << " T " << T;
          size_t kv_differ = 0;
          for (size_t i = 0; i < got.size(); ++i)
            if (static_cast<int64_t>(i) % (3 * C) >= C && got[i] != ref[i]) ++kv_differ;
          EXPECT_EQ(kv_differ, 0u) << "HS " << HS << " T " << T;
        }
        // A half output (for a half product): the f32 one rounded once, and a backward reading it
        // (the row sums of dout * out from the rounded output) within the same tolerance.
        Tensor hout = Tensor::empty({B * T * C}, half, Device::cuda(0));
        cuda::flash_attention_forward(hout.data_ptr(), half, fp(glse), hqkv.data_ptr(), half, B, T,
                                      C, NH, stream());
        EXPECT_EQ(hout.to(DType::f32).to_vector(), gout.to(half).to(DType::f32).to_vector())
            << "HS " << HS << " T " << T;
        // Under autocast dout is half too (the gradient of a half output), and so may be dqkv (the
        // gradient of half q, k, v): the same arithmetic, dqkv rounded once on the way out.
        const Tensor hdout = gdout.to(half);
        cuda::flash_attention_backward(fp(again), DType::f32, fp(gscratch), hdout.data_ptr(),
                                       hqkv.data_ptr(), half, hout.data_ptr(), half, fp(glse), B, T,
                                       C, NH, stream());
        EXPECT_TRUE(close_per_part(again.to_vector(), dqkv, C, part_tol))
            << "HS " << HS << " T " << T;
        Tensor hdqkv = up(std::vector<float>(qkv.size(), nan)).to(half);
        cuda::flash_attention_backward(hdqkv.data_ptr(), half, fp(gscratch), hdout.data_ptr(),
                                       hqkv.data_ptr(), half, hout.data_ptr(), half, fp(glse), B, T,
                                       C, NH, stream());
        EXPECT_EQ(hdqkv.to(DType::f32).to_vector(), again.to(half).to(DType::f32).to_vector())
            << "HS " << HS << " T " << T;
        // The atomic dq with autocast's half dout and output: dk and dv the same bits again.
        {
          cuda::set_flash_backward_atomic_dq(true);
          Tensor atomic = up(std::vector<float>(qkv.size(), nan));
          cuda::flash_attention_backward(fp(atomic), DType::f32, fp(gscratch), hdout.data_ptr(),
                                         hqkv.data_ptr(), half, hout.data_ptr(), half, fp(glse), B,
                                         T, C, NH, stream());
          cuda::set_flash_backward_atomic_dq(false);
          const auto got = atomic.to_vector(), ref = again.to_vector();
          EXPECT_TRUE(close_per_part(got, dqkv, C, part_tol)) << "HS " << HS << " T " << T;
          size_t kv_differ = 0;
          for (size_t i = 0; i < got.size(); ++i)
            if (static_cast<int64_t>(i) % (3 * C) >= C && got[i] != ref[i]) ++kv_differ;
          EXPECT_EQ(kv_differ, 0u) << "HS " << HS << " T " << T;
        }
      }
    }
  EXPECT_FALSE(cuda::flash_attention_supports(48));
}

// The forward's layout chosen by timing (warp_rows 0): the default layout's bits, one line of
// tuning for the shape (timed once: a second call adds none), and no tuning for heads of 128,
// which have one layout.
TEST_F(CudaOps, FlashForwardTuningKeepsTheBits) {
  for (const DType half : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(half));
    // An f32 output and the half one training asks for (a shape of its own for each, so that
    // each is tuned here).
    for (const DType out_type : {DType::f32, half}) {
      const int64_t B = 2, T = out_type == DType::f32 ? 200 : 201, NH = 2;
      for (const int64_t HS : {int64_t{32}, int64_t{64}, int64_t{128}}) {
        SCOPED_TRACE(::testing::Message() << "out " << dtype_name(out_type) << ", HS " << HS);
        const int64_t C = NH * HS;
        const Tensor qkv = up(random_floats(static_cast<size_t>(B * T * 3 * C), 190)).to(half);
        Tensor want = dev_empty(B * T * C, out_type), wlse = dev_empty(B * NH * T);
        cuda::flash_attention_forward(want.data_ptr(), out_type, fp(wlse), qkv.data_ptr(), half, B,
                                      T, C, NH, stream(), 16);
        const size_t notes = cuda::flash_forward_tuning().size();
        for (int call = 0; call < 2; ++call) {
          Tensor out = dev_empty(B * T * C, out_type), lse = dev_empty(B * NH * T);
          cuda::flash_attention_forward(out.data_ptr(), out_type, fp(lse), qkv.data_ptr(), half, B,
                                        T, C, NH, stream(), 0);
          EXPECT_EQ(out.to_vector(), want.to_vector());
          EXPECT_EQ(lse.to_vector(), wlse.to_vector());
        }
        const auto lines = cuda::flash_forward_tuning();
        ASSERT_EQ(lines.size(), notes + (HS <= 64 ? 1 : 0));
        if (HS <= 64) {
          std::cout << "[ measured ] " << lines.back() << "\n";
          EXPECT_NE(lines.back().find("rows a warp"), std::string::npos) << lines.back();
          EXPECT_EQ(lines.back().find("differs"), std::string::npos) << lines.back();
        }
      }
    }
  }
}

TEST_F(CudaOps, GemmHalfOperandsWithF32OutputAndBias) {
  const int64_t M = 37, N = 70, K = 96;
  const auto a = rounded(random_floats(static_cast<size_t>(M * K), 160), DType::bf16);
  const auto w = rounded(random_floats(static_cast<size_t>(N * K), 161), DType::bf16);
  const auto bias = random_floats(static_cast<size_t>(N), 162);
  std::vector<float> want(static_cast<size_t>(M * N));
  cpu::linear_forward(want.data(), a.data(), w.data(), bias.data(), M, K, N);
  Tensor ga = up(a).to(DType::bf16), gw = up(w).to(DType::bf16), gbias = up(bias),
         gout = dev_empty(M * N);
  cuda::GemmShape g = cuda::gemm_shape(M, N, K, false, true);
  g.f32_out = true;
  cuda::matmul(gout.data_ptr(), ga.data_ptr(), gw.data_ptr(), gbias.data_ptr(), DType::bf16, g,
               1.0f, 0.0f, stream());
  // Exact products of bf16 values, summed in f32 in another order: f32 summation error only.
  EXPECT_TRUE(all_close(gout.to_vector(), want, 1e-5, 1e-5));
  // A residual the product joins (cuBLASLt's C, the output its D): residual + product + bias,
  // the residual read and left as it was; likewise the f32 linear.
  const auto res = random_floats(static_cast<size_t>(M * N), 163);
  std::vector<float> want_res(want);
  for (size_t i = 0; i < want_res.size(); ++i) want_res[i] += res[i];
  const Tensor gres = up(res);
  Tensor rout = dev_empty(M * N);
  cuda::matmul(rout.data_ptr(), ga.data_ptr(), gw.data_ptr(), gbias.data_ptr(), DType::bf16, g,
               1.0f, 1.0f, stream(), gres.data_ptr());
  EXPECT_TRUE(all_close(rout.to_vector(), want_res, 1e-5, 1e-5));
  EXPECT_EQ(gres.to_vector(), res);
  Tensor fout = dev_empty(M * N);
  const Tensor fa = up(a), fw = up(w);
  cuda::linear_forward(fout.data_ptr(), fa.data_ptr(), fw.data_ptr(), gbias.data_ptr(), DType::f32,
                       M, K, N, stream(), gres.data_ptr());
  EXPECT_TRUE(all_close(fout.to_vector(), want_res, 1e-5, 1e-5));
  // A bf16 output with the f32 bias (autocast's linear into a half consumer): the f32 sum and
  // bias rounded once, whether cuBLASLt fuses it or the product goes through f32 and a cast.
  Tensor hout = Tensor::empty({M * N}, DType::bf16, Device::cuda(0));
  cuda::GemmShape h = cuda::gemm_shape(M, N, K, false, true);
  h.f32_bias = true;
  cuda::matmul(hout.data_ptr(), ga.data_ptr(), gw.data_ptr(), gbias.data_ptr(), DType::bf16, h,
               1.0f, 0.0f, stream());
  const auto got = hout.to(DType::f32).to_vector();
  const auto near = gout.to(DType::bf16).to(DType::f32).to_vector();
  // Equal to the f32 output rounded, but where the two sums straddle a rounding boundary: one
  // bf16 step at most.
  ASSERT_EQ(got.size(), near.size());
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_LE(std::fabs(got[i] - near[i]), std::fabs(near[i]) * (1.0f / 128) + 1e-6f) << i;
}

// A weight gradient with its bias gradient (cuBLASLt's BGRADB epilogue, or the product and a
// column sum where it has no kernel or is asked not to fuse): dw = dout^T @ x and db = dout's
// column sums, both written over what the buffers held, in bf16 with f32 output and in f32.
TEST_F(CudaOps, WeightGradientProductSumsTheBiasGradient) {
  const int64_t BT = 300, Ci = 96, Co = 72;
  const auto dout = rounded(random_floats(static_cast<size_t>(BT * Co), 170), DType::bf16);
  const auto x = rounded(random_floats(static_cast<size_t>(BT * Ci), 171), DType::bf16);
  std::vector<float> want_dw(static_cast<size_t>(Co * Ci)), want_db(static_cast<size_t>(Co));
  cpu::matmul(want_dw.data(), dout.data(), x.data(), Co, Ci, BT, true, false, 1.0f, 0.0f);
  cpu::sum_first_dim(want_db.data(), dout.data(), BT, Co, false);
  const test::ProductSwitches restore;
  for (const bool fused : {true, false}) {
    for (const DType t : {DType::bf16, DType::f32}) {
      SCOPED_TRACE(std::string(fused ? "fused " : "separate ") + std::string(dtype_name(t)));
      cuda::set_fused_epilogues(fused);
      const Tensor gd = up(dout).to(t), gx = up(x).to(t);
      Tensor dw = up(std::vector<float>(want_dw.size(), 7.0f));
      Tensor db = up(std::vector<float>(want_db.size(), 7.0f));
      cuda::GemmShape g = cuda::gemm_shape(Co, Ci, BT, true);
      g.f32_out = t != DType::f32;
      cuda::matmul_bias_grad(dw.data_ptr(), fp(db), gd.data_ptr(), gx.data_ptr(), t, g, stream());
      // Exact products of bf16 values summed in f32 in other orders: f32 summation error only.
      EXPECT_TRUE(all_close(dw.to_vector(), want_dw, 1e-5, 1e-5));
      EXPECT_TRUE(all_close(db.to_vector(), want_db, 1e-5, 1e-5));
      Tensor dw_only = dev_empty(Co * Ci);
      cuda::matmul_bias_grad(dw_only.data_ptr(), nullptr, gd.data_ptr(), gx.data_ptr(), t, g,
                             stream());
      EXPECT_TRUE(all_close(dw_only.to_vector(), want_dw, 1e-5, 1e-5));
    }
  }
}

// GELU in the product's epilogue both ways (cuBLASLt's GELU_AUX_BIAS and DGELU_BGRAD, or the
// product and our kernels where it has none or is asked not to fuse), against the CPU's
// definition (autograd/gelu_mlp.h): the kept input and the outputs one bf16 step apart at most
// where two f32 sums straddle a rounding, GELU's formula within bf16 (cuBLASLt's tanh form need
// not be ours to the last bit), the bias gradient within f32 summation error of the rounded
// gradient's sums.
TEST_F(CudaOps, GeluInTheProductsEpilogueBothWays) {
  const int64_t M = 200, N = 96, K = 64;
  const auto a = rounded(random_floats(static_cast<size_t>(M * K), 180), DType::bf16);
  const auto w = rounded(random_floats(static_cast<size_t>(N * K), 181), DType::bf16);
  const auto bias = random_floats(static_cast<size_t>(N), 182);
  std::vector<float> sum(static_cast<size_t>(M * N)), want(sum.size());
  cpu::linear_forward(sum.data(), a.data(), w.data(), bias.data(), M, K, N);
  cpu::gelu_forward(want.data(), sum.data(), M * N);
  const auto want_pre = rounded(sum, DType::bf16);
  want = rounded(want, DType::bf16);
  // Backward: dout [M, K] through w [N, K] as the second product's input gradient into [M, N].
  const auto dout = rounded(random_floats(static_cast<size_t>(M * K), 183), DType::bf16);
  const auto w2 = rounded(random_floats(static_cast<size_t>(K * N), 184), DType::bf16);
  std::vector<float> dh(sum.size()), want_dpre(sum.size()), want_db(static_cast<size_t>(N));
  cpu::matmul(dh.data(), dout.data(), w2.data(), M, N, K, false, false, 1.0f, 0.0f);
  cpu::gelu_backward(want_dpre.data(), want_pre.data(), dh.data(), M * N);
  want_dpre = rounded(want_dpre, DType::bf16);
  cpu::sum_first_dim(want_db.data(), want_dpre.data(), M, N, false);
  auto near_bf16 = [](const std::vector<float>& got, const std::vector<float>& ref, float abs) {
    ASSERT_EQ(got.size(), ref.size());
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_LE(std::fabs(got[i] - ref[i]), std::fabs(ref[i]) * (1.0f / 64) + abs) << i;
  };
  const test::ProductSwitches restore;
  for (const bool fused : {true, false}) {
    SCOPED_TRACE(fused ? "fused" : "separate");
    cuda::set_fused_epilogues(fused);
    const Tensor ga = up(a).to(DType::bf16), gw = up(w).to(DType::bf16), gbias = up(bias);
    Tensor out = Tensor::empty({M * N}, DType::bf16, Device::cuda(0));
    Tensor pre = Tensor::empty({M * N}, DType::bf16, Device::cuda(0));
    cuda::matmul_gelu(out.data_ptr(), pre.data_ptr(), ga.data_ptr(), gw.data_ptr(), fp(gbias),
                      DType::bf16, cuda::gemm_shape(M, N, K, false, true), stream());
    near_bf16(pre.to(DType::f32).to_vector(), want_pre, 1e-6f);
    near_bf16(out.to(DType::f32).to_vector(), want, 1e-3f);
    const Tensor gd = up(dout).to(DType::bf16), gw2 = up(w2).to(DType::bf16);
    const Tensor gpre = up(want_pre).to(DType::bf16);
    Tensor dpre = Tensor::empty({M * N}, DType::bf16, Device::cuda(0));
    Tensor db = up(std::vector<float>(want_db.size(), 7.0f));
    cuda::matmul_dgelu(dpre.data_ptr(), fp(db), gd.data_ptr(), gw2.data_ptr(), gpre.data_ptr(),
                       DType::bf16, cuda::gemm_shape(M, N, K), stream());
    const auto got_dpre = dpre.to(DType::f32).to_vector();
    near_bf16(got_dpre, want_dpre, 1e-3f);
    // The bias gradient is the column sums of the gradient as written (or of its f32 values
    // before the rounding, where cuBLASLt sums them): within the rounding of M terms.
    std::vector<float> sums(static_cast<size_t>(N));
    cpu::sum_first_dim(sums.data(), got_dpre.data(), M, N, false);
    const auto got_db = db.to_vector();
    for (int64_t j = 0; j < N; ++j) {
      double mag = 0;
      for (int64_t i = 0; i < M; ++i) mag += std::fabs(got_dpre[static_cast<size_t>(i * N + j)]);
      EXPECT_LE(std::fabs(got_db[static_cast<size_t>(j)] - sums[static_cast<size_t>(j)]),
                mag * (1.0 / 256) + 1e-5)
          << j;
    }
  }
  for (const std::string& f : cuda::epilogue_fallbacks())
    std::cout << "separate kernels: " << f << "\n";
}

}  // namespace
}  // namespace meshtrain

#else

TEST(CudaOps, BuiltWithoutCuda) {
  MT_SKIP_UNLESS("cuda", false, "built without CUDA: the cross-device op tests are not compiled");
}

#endif
