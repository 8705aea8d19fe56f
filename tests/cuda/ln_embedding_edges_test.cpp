// Edge cases of the device LayerNorm and GPT embedding kernels against their CPU references
// (tensor/cpu): rows narrower than a warp, missing weight or bias, the fused backward's width
// limit, rows of zero variance and non-finite rows, and embedding indices outside the table,
// repeated tokens and empty batches. Skipped, with the reason, where the process has no device.
#include <gtest/gtest.h>

#include "tests/support/capability.h"

#if MESHTRAIN_HAVE_CUDA

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "meshtrain/cuda/kernels/embedding.h"
#include "meshtrain/cuda/kernels/layer_norm.h"
#include "meshtrain/tensor/cpu/embedding.h"
#include "meshtrain/tensor/cpu/layer_norm.h"
#include "meshtrain/util/error.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/cuda/device_vectors.h"

namespace meshtrain {
namespace {

using test::all_close;
using test::dev_empty;
using test::fp;
using test::ip;
using test::random_floats;
using test::random_ints;
using test::stream;
using test::up;

constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> filled(int64_t n, float v) {
  return std::vector<float>(static_cast<size_t>(n), v);
}

// The CPU's forward and backward of one LayerNorm (parameter gradients into zeros), for the
// device to be compared with.
struct HostLayerNorm {
  std::vector<float> y, mean, rstd, dx, dw, db;
  HostLayerNorm(const std::vector<float>& x, const float* w, const float* b,
                const std::vector<float>& dout, int64_t N, int64_t C, float eps)
      : y(x.size()),
        mean(static_cast<size_t>(N)),
        rstd(static_cast<size_t>(N)),
        dx(x.size()),
        dw(static_cast<size_t>(C), 0.0f),
        db(static_cast<size_t>(C), 0.0f) {
    cpu::layer_norm_forward(y.data(), mean.data(), rstd.data(), x.data(), w, b, N, C, eps);
    cpu::layer_norm_backward(dx.data(), dw.data(), db.data(), dout.data(), x.data(), w, mean.data(),
                             rstd.data(), N, C);
  }
};

class CudaLayerNormEmbeddingEdges : public test::DeviceKernelTest {};

// A warp owns a row: rows narrower than the warp (C = 1 leaves 31 lanes idle, and every row has
// zero variance) and not a multiple of it, a row count that leaves the last block's warps partly
// idle, and each of weight and bias absent (the kernels take null for 1 and 0).
TEST_F(CudaLayerNormEmbeddingEdges, NarrowRowsWithoutWeightOrBiasFollowTheHost) {
  const int64_t N = 37;
  for (const int64_t C : {int64_t{1}, int64_t{3}, int64_t{31}, int64_t{33}, int64_t{100}})
    for (const bool has_w : {false, true})
      for (const bool has_b : {false, true}) {
        SCOPED_TRACE("C " + std::to_string(C) + (has_w ? " weight" : "") + (has_b ? " bias" : ""));
        const auto x = random_floats(static_cast<size_t>(N * C), 300, -2.0f, 3.0f);
        const auto w = random_floats(static_cast<size_t>(C), 301);
        const auto b = random_floats(static_cast<size_t>(C), 302);
        const auto dout = random_floats(static_cast<size_t>(N * C), 303);
        const HostLayerNorm h(x, has_w ? w.data() : nullptr, has_b ? b.data() : nullptr, dout, N, C,
                              1e-5f);
        Tensor gx = up(x), gw = up(w), gb = up(b), gdout = up(dout), gy = dev_empty(N * C),
               gmean = dev_empty(N), grstd = dev_empty(N), gdx = dev_empty(N * C),
               gdw = up(filled(C, kNan)), gdb = up(filled(C, kNan));
        cuda::layer_norm_forward(fp(gy), DType::f32, fp(gmean), fp(grstd), fp(gx),
                                 has_w ? fp(gw) : nullptr, has_b ? fp(gb) : nullptr, N, C, 1e-5f,
                                 stream());
        cuda::layer_norm_backward(fp(gdx), fp(gdw), fp(gdb), fp(gdout), DType::f32, fp(gx),
                                  has_w ? fp(gw) : nullptr, fp(gmean), fp(grstd), N, C, stream());
        // rsqrtf is within 2 ulp of 1/sqrt and the row sums run in another order: a few ulp of
        // the outputs, and the backward's sums over C and N on top.
        EXPECT_TRUE(all_close(gy.to_vector(), h.y, 1e-5, 1e-5));
        EXPECT_TRUE(all_close(gmean.to_vector(), h.mean, 1e-5, 1e-6));
        EXPECT_TRUE(all_close(grstd.to_vector(), h.rstd, 1e-5, 1e-6));
        EXPECT_TRUE(all_close(gdx.to_vector(), h.dx, 1e-4, 1e-5));
        EXPECT_TRUE(all_close(gdw.to_vector(), h.dw, 1e-4, 1e-4));
        EXPECT_TRUE(all_close(gdb.to_vector(), h.db, 1e-4, 1e-4));
      }
  // No rows: the forward writes nothing (a kernel over no rows must not touch its outputs).
  Tensor y = up(filled(8, 7.0f)), mean = up(filled(1, 7.0f)), x = up(filled(8, 1.0f));
  cuda::layer_norm_forward(fp(y), DType::f32, fp(mean), fp(mean), fp(x), nullptr, nullptr, 0, 8,
                           1e-5f, stream());
  EXPECT_EQ(y.to_vector(), filled(8, 7.0f));
  EXPECT_EQ(mean.to_vector(), filled(1, 7.0f));
}

// The backward sums the parameter gradients in the kernel that writes the input gradient while
// 4 warps' rows of 2C floats fit 48 KiB (C <= 1536) and in a column-sum pass from C = 1537: each
// side of the limit with a single row (one busy warp in one block) and with several row chunks,
// one parameter gradient at a time (the other null), and the input gradient written or added.
TEST_F(CudaLayerNormEmbeddingEdges, BackwardAtTheFusedWidthLimitFollowsTheHost) {
  for (const int64_t C : {int64_t{1536}, int64_t{1537}})
    for (const int64_t N : {int64_t{1}, int64_t{70}}) {
      SCOPED_TRACE("C " + std::to_string(C) + " N " + std::to_string(N));
      const auto x = random_floats(static_cast<size_t>(N * C), 310, -2.0f, 3.0f);
      const auto w = random_floats(static_cast<size_t>(C), 311);
      const auto dout = random_floats(static_cast<size_t>(N * C), 312);
      const auto prior = random_floats(x.size(), 313);
      const HostLayerNorm h(x, w.data(), nullptr, dout, N, C, 1e-5f);
      Tensor gx = up(x), gw = up(w), gdout = up(dout), gmean = up(h.mean), grstd = up(h.rstd);
      // The bias's gradient alone beside the input gradient, then the weight's alone without it.
      Tensor gdx = dev_empty(N * C), gdb = up(filled(C, kNan)), gdw = up(filled(C, kNan));
      cuda::layer_norm_backward(fp(gdx), nullptr, fp(gdb), fp(gdout), DType::f32, fp(gx), fp(gw),
                                fp(gmean), fp(grstd), N, C, stream());
      cuda::layer_norm_backward(nullptr, fp(gdw), nullptr, fp(gdout), DType::f32, fp(gx), fp(gw),
                                fp(gmean), fp(grstd), N, C, stream());
      EXPECT_TRUE(all_close(gdx.to_vector(), h.dx, 1e-4, 1e-5));
      EXPECT_TRUE(all_close(gdb.to_vector(), h.db, 1e-4, 1e-4));
      EXPECT_TRUE(all_close(gdw.to_vector(), h.dw, 1e-4, 1e-4));
      // Added to a gradient summed already: the bits of the fresh gradient added apart, with and
      // without parameter gradients beside it (the two kernels that write it).
      std::vector<float> apart = gdx.to_vector();
      for (size_t i = 0; i < apart.size(); ++i) apart[i] = prior[i] + apart[i];
      for (const bool params : {true, false}) {
        Tensor into = up(prior), pdb = up(filled(C, kNan));
        cuda::layer_norm_backward(fp(into), nullptr, params ? fp(pdb) : nullptr, fp(gdout),
                                  DType::f32, fp(gx), fp(gw), fp(gmean), fp(grstd), N, C, stream(),
                                  true);
        EXPECT_EQ(into.to_vector(), apart) << "bias gradient beside it: " << params;
        if (params) {
          EXPECT_EQ(pdb.to_vector(), gdb.to_vector());
        }
      }
    }
}

// A row of equal values has zero variance: the output is the bias exactly (x - mean is 0 for
// these values and widths on both sides, the sums being exact), rstd is 1/sqrt(eps), and the
// input gradient is (dn - mean(dn)) * rstd. With eps = 0, rstd is infinite and 0 * inf makes the
// row NaN on the host; the device must agree rather than give 0 or a finite value.
TEST_F(CudaLayerNormEmbeddingEdges, RowsOfEqualValuesNormaliseToTheBias) {
  for (const int64_t C : {int64_t{1}, int64_t{5}, int64_t{32}, int64_t{1536}, int64_t{1537}})
    for (const float eps : {1e-5f, 0.0f}) {
      SCOPED_TRACE("C " + std::to_string(C) + " eps " + std::to_string(eps));
      const int64_t N = 2;
      std::vector<float> x = filled(N * C, 0.75f);
      for (int64_t c = 0; c < C; ++c) x[static_cast<size_t>(C + c)] = -3.5f;
      const auto w = random_floats(static_cast<size_t>(C), 320);
      const auto b = random_floats(static_cast<size_t>(C), 321);
      const auto dout = random_floats(x.size(), 322);
      const HostLayerNorm h(x, w.data(), b.data(), dout, N, C, eps);
      Tensor gx = up(x), gw = up(w), gb = up(b), gdout = up(dout), gy = dev_empty(N * C),
             gmean = dev_empty(N), grstd = dev_empty(N), gdx = dev_empty(N * C), gdw = dev_empty(C),
             gdb = dev_empty(C);
      cuda::layer_norm_forward(fp(gy), DType::f32, fp(gmean), fp(grstd), fp(gx), fp(gw), fp(gb), N,
                               C, eps, stream());
      cuda::layer_norm_backward(fp(gdx), fp(gdw), fp(gdb), fp(gdout), DType::f32, fp(gx), fp(gw),
                                fp(gmean), fp(grstd), N, C, stream());
      EXPECT_EQ(gmean.to_vector(), h.mean);
      if (eps > 0.0f) {
        std::vector<float> bias_rows(b);
        bias_rows.insert(bias_rows.end(), b.begin(), b.end());
        EXPECT_EQ(h.y, bias_rows) << "the host's reference itself";
        EXPECT_EQ(gy.to_vector(), bias_rows);
      }
      EXPECT_TRUE(all_close(gy.to_vector(), h.y, 0, 0)) << "NaN where the host has NaN";
      EXPECT_TRUE(all_close(grstd.to_vector(), h.rstd, 1e-6, 0));
      // rstd = 316 magnifies the mean of dn's summation error (~1e-6): atol 316 * 2e-6.
      EXPECT_TRUE(all_close(gdx.to_vector(), h.dx, 1e-4, 1e-3));
      EXPECT_TRUE(all_close(gdw.to_vector(), h.dw, 1e-4, 1e-4));
      EXPECT_TRUE(all_close(gdb.to_vector(), h.db, 1e-4, 1e-4));
    }
}

// NaN and infinity poison their own row (and the weight gradient's columns, which sum over
// rows) but never a neighbour row: every warp keeps its row's sums to itself. A huge value
// overflows the variance to infinity, so rstd is 0 and the row's output is the bias. On both
// sides of the fused width limit.
TEST_F(CudaLayerNormEmbeddingEdges, NonFiniteValuesStayInTheirRow) {
  for (const int64_t C : {int64_t{40}, int64_t{1600}}) {
    SCOPED_TRACE("C " + std::to_string(C));
    const int64_t N = 11;
    auto x = random_floats(static_cast<size_t>(N * C), 330, -2.0f, 3.0f);
    x[static_cast<size_t>(2 * C + 3)] = kNan;
    x[static_cast<size_t>(5 * C + C - 1)] = kInf;
    x[static_cast<size_t>(8 * C)] = -kInf;
    x[static_cast<size_t>(9 * C + 1)] = 3.0e38f;
    const auto w = random_floats(static_cast<size_t>(C), 331);
    const auto b = random_floats(static_cast<size_t>(C), 332);
    const auto dout = random_floats(x.size(), 333);
    const HostLayerNorm h(x, w.data(), b.data(), dout, N, C, 1e-5f);
    Tensor gx = up(x), gw = up(w), gb = up(b), gdout = up(dout), gy = dev_empty(N * C),
           gmean = dev_empty(N), grstd = dev_empty(N), gdx = dev_empty(N * C), gdw = dev_empty(C),
           gdb = dev_empty(C), odx = dev_empty(N * C);
    cuda::layer_norm_forward(fp(gy), DType::f32, fp(gmean), fp(grstd), fp(gx), fp(gw), fp(gb), N, C,
                             1e-5f, stream());
    cuda::layer_norm_backward(fp(gdx), fp(gdw), fp(gdb), fp(gdout), DType::f32, fp(gx), fp(gw),
                              fp(gmean), fp(grstd), N, C, stream());
    // The input gradient's own kernel (no parameter gradients) as well.
    cuda::layer_norm_backward(fp(odx), nullptr, nullptr, fp(gdout), DType::f32, fp(gx), fp(gw),
                              fp(gmean), fp(grstd), N, C, stream());
    EXPECT_TRUE(std::isnan(h.y[static_cast<size_t>(2 * C)])) << "the host poisons the row";
    EXPECT_FALSE(std::isnan(h.y[static_cast<size_t>(3 * C)])) << "and only the row";
    EXPECT_TRUE(all_close(gy.to_vector(), h.y, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(gmean.to_vector(), h.mean, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(grstd.to_vector(), h.rstd, 1e-5, 1e-6));
    EXPECT_TRUE(all_close(gdx.to_vector(), h.dx, 1e-4, 1e-5));
    EXPECT_TRUE(all_close(odx.to_vector(), h.dx, 1e-4, 1e-5));
    // The weight's gradient is NaN in every column; the bias's sums dout alone and stays finite.
    EXPECT_TRUE(all_close(gdw.to_vector(), h.dw, 1e-4, 1e-4));
    EXPECT_TRUE(all_close(gdb.to_vector(), h.db, 1e-4, 1e-4));
  }
}

// Token ids outside [0, V): the host refuses them; the device cannot throw, so the row is NaN and
// the token table's gradient leaves the position out. Neither kernel may touch memory outside the
// tables: the tables sit between guard rows, which a read would bring into the output (finite
// instead of NaN) and a write would change.
TEST_F(CudaLayerNormEmbeddingEdges, EmbeddingOfOutOfRangeTokensStaysInsideTheTables) {
  const int64_t B = 2, T = 9, C = 20, V = 6, guard = 8 * C;
  auto idx = random_ints(static_cast<size_t>(B * T), 340, 0, static_cast<int32_t>(V - 1));
  const std::vector<int32_t> bad = {-1, static_cast<int32_t>(V),
                                    std::numeric_limits<int32_t>::min(),
                                    std::numeric_limits<int32_t>::max(), -2};
  const std::vector<size_t> at = {0, 4, 9, 13, 17};
  const auto wte = random_floats(static_cast<size_t>(V * C), 341);
  const auto wpe = random_floats(static_cast<size_t>(T * C), 342);
  const auto dout = random_floats(static_cast<size_t>(B * T * C), 343);
  std::vector<float> want_out(static_cast<size_t>(B * T * C));
  cpu::gpt_embedding_forward(want_out.data(), idx.data(), wte.data(), wpe.data(), B, T, C, V);
  std::vector<int32_t> good_idx;  // the in-range positions, in order, and their dout rows
  std::vector<float> good_dout;
  auto with_bad = idx;
  for (size_t k = 0; k < at.size(); ++k) with_bad[at[k]] = bad[k];
  for (size_t p = 0; p < with_bad.size(); ++p) {
    if (with_bad[p] < 0 || with_bad[p] >= V) {
      for (int64_t c = 0; c < C; ++c) want_out[p * C + static_cast<size_t>(c)] = kNan;
      continue;
    }
    good_idx.push_back(with_bad[p]);
    good_dout.insert(good_dout.end(), dout.begin() + static_cast<int64_t>(p) * C,
                     dout.begin() + static_cast<int64_t>(p + 1) * C);
  }
  std::vector<float> out_host(want_out.size());
  EXPECT_THROW(cpu::gpt_embedding_forward(out_host.data(), with_bad.data(), wte.data(), wpe.data(),
                                          B, T, C, V),
               Error);
  // The token table's gradient over the in-range positions in position order, into zeros.
  std::vector<float> want_dwte(wte.size(), 0.0f);
  cpu::gpt_embedding_backward(want_dwte.data(), nullptr, good_dout.data(), good_idx.data(), 1,
                              static_cast<int64_t>(good_idx.size()), C, V);
  // Guard rows of a large finite value around the token table; of zeros around its gradient.
  std::vector<float> table = filled(guard, 1e30f);
  table.insert(table.end(), wte.begin(), wte.end());
  table.insert(table.end(), static_cast<size_t>(guard), 1e30f);
  const std::vector<float> grad_guarded = filled(guard + V * C + guard, 0.0f);
  Tensor gidx = up(with_bad), gtable = up(table), gwpe = up(wpe), gdout = up(dout),
         gout = dev_empty(B * T * C), gdwte = up(grad_guarded);
  cuda::gpt_embedding_forward(fp(gout), ip(gidx), fp(gtable) + guard, fp(gwpe), B, T, C, V,
                              stream());
  cuda::gpt_embedding_backward(fp(gdwte) + guard, nullptr, fp(gdout), ip(gidx), B, T, C, V,
                               stream());
  EXPECT_TRUE(all_close(gout.to_vector(), want_out, 0, 0));
  const std::vector<float> got = gdwte.to_vector();
  EXPECT_EQ(std::vector<float>(got.begin(), got.begin() + guard), filled(guard, 0.0f));
  EXPECT_EQ(std::vector<float>(got.end() - guard, got.end()), filled(guard, 0.0f));
  EXPECT_EQ(std::vector<float>(got.begin() + guard, got.end() - guard), want_dwte);
}

// Every position holds the same token: one block sums the whole batch for it, past the eight
// rows it reads ahead (903 rows leave a tail of 7) and past its 256 threads' columns (C = 300).
// Into zero tables the host's bits; into a held gradient that gradient plus them, as a separate
// addition would give; each table's gradient alone (the other null); and a sequence shorter than
// a block. A batch with no positions, or rows with no channels, writes nothing.
TEST_F(CudaLayerNormEmbeddingEdges, EmbeddingBackwardOfOneRepeatedTokenIsTheHostsSum) {
  struct Case {
    int64_t B, T, C, V;
  };
  for (const Case s : {Case{3, 301, 300, 7}, Case{2, 5, 3, 4}}) {
    SCOPED_TRACE("T " + std::to_string(s.T) + " C " + std::to_string(s.C));
    const std::vector<int32_t> idx(static_cast<size_t>(s.B * s.T), static_cast<int32_t>(s.V - 2));
    const auto dout = random_floats(static_cast<size_t>(s.B * s.T * s.C), 350);
    std::vector<float> dwte(static_cast<size_t>(s.V * s.C), 0.0f),
        dwpe(static_cast<size_t>(s.T * s.C), 0.0f);
    cpu::gpt_embedding_backward(dwte.data(), dwpe.data(), dout.data(), idx.data(), s.B, s.T, s.C,
                                s.V);
    const auto prior = random_floats(dwte.size(), 351);
    std::vector<float> summed(dwte.size());
    for (size_t i = 0; i < dwte.size(); ++i) summed[i] = prior[i] + dwte[i];
    Tensor gidx = up(idx), gdout = up(dout), zte = up(filled(s.V * s.C, 0.0f)),
           zpe = up(filled(s.T * s.C, 0.0f)), held = up(prior);
    cuda::gpt_embedding_backward(fp(zte), nullptr, fp(gdout), ip(gidx), s.B, s.T, s.C, s.V,
                                 stream());
    cuda::gpt_embedding_backward(nullptr, fp(zpe), fp(gdout), ip(gidx), s.B, s.T, s.C, s.V,
                                 stream());
    cuda::gpt_embedding_backward(fp(held), nullptr, fp(gdout), ip(gidx), s.B, s.T, s.C, s.V,
                                 stream());
    EXPECT_EQ(zte.to_vector(), dwte);
    EXPECT_EQ(zpe.to_vector(), dwpe);
    EXPECT_EQ(held.to_vector(), summed);
  }
  // Nothing to do: the tables keep what they held (NaN would show any write).
  Tensor one = up(std::vector<int32_t>{0}), table = up(filled(8, kNan)), g = up(filled(8, 1.0f)),
         out = up(filled(8, kNan));
  for (const Case s : {Case{0, 1, 4, 2}, Case{1, 0, 4, 2}, Case{1, 1, 0, 2}}) {
    cuda::gpt_embedding_forward(fp(out), ip(one), fp(g), fp(g), s.B, s.T, s.C, s.V, stream());
    cuda::gpt_embedding_backward(fp(table), fp(table), fp(g), ip(one), s.B, s.T, s.C, s.V,
                                 stream());
  }
  EXPECT_TRUE(all_close(out.to_vector(), filled(8, kNan), 0, 0));
  EXPECT_TRUE(all_close(table.to_vector(), filled(8, kNan), 0, 0));
}

}  // namespace
}  // namespace meshtrain

#endif  // MESHTRAIN_HAVE_CUDA
