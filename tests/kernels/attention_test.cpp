// Fused causal attention against a naive double reference on the packed qkv layout; the backward
// against central differences of that reference. T values straddle the kernel's 64-row blocks.
// Scores are dot products of length HS <= 16 and probabilities sums of <= 130 terms, so float
// errors stay below 1e-6 relative; 1e-5 (1e-4 for gradients) leaves margin.
#include "meshtrain/tensor/cpu/attention.h"

#include "meshtrain/util/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

// out[B, T, C] from qkv[B, T, 3C]; att[B, NH, T, T] when given.
DVec ref_attention(const DVec& qkv, int64_t B, int64_t T, int64_t C, int64_t NH,
                   DVec* att = nullptr) {
  const int64_t HS = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(HS));
  DVec out(B * T * C, 0.0);
  DVec row(T);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < NH; ++h) {
      for (int64_t i = 0; i < T; ++i) {
        const double* q = &qkv[(b * T + i) * 3 * C + h * HS];
        double m = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          const double* k = &qkv[(b * T + j) * 3 * C + C + h * HS];
          double s = 0.0;
          for (int64_t d = 0; d < HS; ++d) s += q[d] * k[d];
          row[j] = s * scale;
          m = std::max(m, row[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(row[j] - m);
        for (int64_t j = 0; j < T; ++j) {
          const double p = j <= i ? std::exp(row[j] - m) / sum : 0.0;
          if (att) (*att)[((b * NH + h) * T + i) * T + j] = p;
          if (j > i) continue;
          const double* v = &qkv[(b * T + j) * 3 * C + 2 * C + h * HS];
          for (int64_t d = 0; d < HS; ++d) out[(b * T + i) * C + h * HS + d] += p * v[d];
        }
      }
    }
  }
  return out;
}

struct Shape {
  int64_t B, T, C, NH;
};

TEST(Attention, ForwardMatchesReference) {
  for (const Shape s : {Shape{1, 1, 4, 1}, Shape{2, 5, 8, 2}, Shape{2, 33, 12, 3},
                        Shape{1, 130, 16, 2}, Shape{3, 64, 32, 4}}) {
    const Vec qkv = random_vec(s.B * s.T * 3 * s.C, 1, -2.0f, 2.0f);
    Vec out(s.B * s.T * s.C, std::nanf("")), att(s.B * s.NH * s.T * s.T, std::nanf(""));
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    DVec ratt(att.size());
    const DVec rout = ref_attention(to_double(qkv), s.B, s.T, s.C, s.NH, &ratt);
    expect_close(out, rout, 1e-5, 1e-5, "attention out");
    expect_close(att, ratt, 1e-5, 1e-6, "attention probabilities");
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (const Shape s : {Shape{1, 3, 4, 2}, Shape{2, 9, 8, 2}, Shape{1, 67, 6, 2}}) {
    const int64_t n = s.B * s.T * 3 * s.C;
    const Vec qkv = random_vec(n, 2, -1.5f, 1.5f), dout = random_vec(s.B * s.T * s.C, 3);
    Vec out(s.B * s.T * s.C), att(s.B * s.NH * s.T * s.T);
    Vec scratch(att.size(), std::nanf(""));  // garbage scratch must not leak into the result
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    Vec dqkv(n, std::nanf(""));  // written, not accumulated: every element is overwritten
    attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                       s.C, s.NH);
    const DVec g =
        numeric_grad([&](const DVec& v) { return ref_attention(v, s.B, s.T, s.C, s.NH); },
                     to_double(qkv), to_double(dout));
    expect_close(dqkv, g, 1e-4, 1e-5, "attention dqkv");
  }
}

TEST(Attention, RejectsHeadsThatDoNotDivideChannels) {
  Vec qkv(3 * 10), out(10), att(1);
  EXPECT_THROW(attention_forward(out.data(), att.data(), qkv.data(), 1, 1, 10, 3), Error);
}

// The per-head products are single-threaded sgemm calls inside the parallel loop, so even they do
// not depend on the thread count here.
TEST(Attention, ThreadCountDoesNotChangeBits) {
  const Shape s{3, 100, 24, 3};
  const Vec qkv = random_vec(s.B * s.T * 3 * s.C, 5), dout = random_vec(s.B * s.T * s.C, 6);
  expect_thread_independent([&] {
    Vec out(s.B * s.T * s.C), att(s.B * s.NH * s.T * s.T), scratch(att.size());
    Vec dqkv(qkv.size(), 0.0f);
    attention_forward(out.data(), att.data(), qkv.data(), s.B, s.T, s.C, s.NH);
    attention_backward(dqkv.data(), scratch.data(), dout.data(), qkv.data(), att.data(), s.B, s.T,
                       s.C, s.NH);
    return std::vector<Vec>{out, att, dqkv};
  });
}

}  // namespace
}  // namespace meshtrain::cpu::testing
