// Embedding lookups and their scatter-add backwards against double loops, with repeated indices
// so that several rows land on one table row. The backward is a sum of at most B*T float terms
// of size ~1, so 1e-5 relative of the array scale bounds its rounding.
#include "meshtrain/tensor/cpu/embedding.h"

#include "meshtrain/util/error.h"
#include "tests/kernels/kernel_test_util.h"

namespace meshtrain::cpu::testing {
namespace {

std::vector<int32_t> random_idx(int64_t n, int64_t V, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> idx(n);
  for (auto& x : idx) x = static_cast<int32_t>(gen() % V);
  return idx;
}

TEST(Embedding, GptForwardAndBackwardMatchReference) {
  const int64_t shapes[][4] = {{1, 1, 1, 1}, {2, 5, 7, 3}, {4, 16, 130, 11}};
  for (const auto& s : shapes) {
    const int64_t B = s[0], T = s[1], C = s[2], V = s[3];
    const std::vector<int32_t> idx = random_idx(B * T, V, 1);
    const Vec wte = random_vec(V * C, 2), wpe = random_vec((T + 2) * C, 3);
    Vec out(B * T * C);
    gpt_embedding_forward(out.data(), idx.data(), wte.data(), wpe.data(), B, T, C, V);
    DVec ref(B * T * C);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < C; ++c)
          ref[(b * T + t) * C + c] =
              static_cast<double>(wte[idx[b * T + t] * C + c]) + wpe[t * C + c];
    expect_close(out, ref, 1e-7, 0.0, "embedding out");

    const Vec dout = random_vec(B * T * C, 4), dwte0 = random_vec(V * C, 5),
              dwpe0 = random_vec((T + 2) * C, 6);
    Vec dwte = dwte0, dwpe = dwpe0;
    gpt_embedding_backward(dwte.data(), dwpe.data(), dout.data(), idx.data(), B, T, C, V);
    DVec rwte(dwte0.begin(), dwte0.end()), rwpe(dwpe0.begin(), dwpe0.end());
    for (int64_t bt = 0; bt < B * T; ++bt) {
      for (int64_t c = 0; c < C; ++c) {
        rwte[idx[bt] * C + c] += dout[bt * C + c];
        rwpe[(bt % T) * C + c] += dout[bt * C + c];
      }
    }
    expect_close(dwte, rwte, 1e-5, 1e-6, "dwte");
    expect_close(dwpe, rwpe, 1e-5, 1e-6, "dwpe");
  }
}

TEST(Embedding, PlainLookupAndBackward) {
  const int64_t N = 37, C = 45, V = 9;
  const std::vector<int32_t> idx = random_idx(N, V, 7);
  const Vec table = random_vec(V * C, 8), dout = random_vec(N * C, 9), d0 = random_vec(V * C, 10);
  Vec out(N * C), dtable = d0;
  embedding_forward(out.data(), idx.data(), table.data(), N, C, V);
  embedding_backward(dtable.data(), dout.data(), idx.data(), N, C, V);
  DVec rout(N * C), rd(d0.begin(), d0.end());
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      rout[n * C + c] = table[idx[n] * C + c];
      rd[idx[n] * C + c] += dout[n * C + c];
    }
  }
  expect_close(out, rout, 0.0, 0.0, "lookup");
  expect_close(dtable, rd, 1e-5, 1e-6, "dtable");
}

TEST(Embedding, RejectsOutOfRangeIndex) {
  const Vec table(3 * 2);
  Vec out(2 * 2);
  const std::vector<int32_t> idx{0, 3};
  EXPECT_THROW(embedding_forward(out.data(), idx.data(), table.data(), 2, 2, 3), Error);
}

TEST(Embedding, ThreadCountDoesNotChangeBits) {
  const int64_t B = 8, T = 64, C = 200, V = 13;  // few distinct tokens: many collisions
  const std::vector<int32_t> idx = random_idx(B * T, V, 11);
  const Vec wte = random_vec(V * C, 12), wpe = random_vec(T * C, 13),
            dout = random_vec(B * T * C, 14);
  expect_thread_independent([&] {
    Vec out(B * T * C), dwte(V * C, 0.0f), dwpe(T * C, 0.0f), dtable(V * C, 0.0f);
    gpt_embedding_forward(out.data(), idx.data(), wte.data(), wpe.data(), B, T, C, V);
    gpt_embedding_backward(dwte.data(), dwpe.data(), dout.data(), idx.data(), B, T, C, V);
    embedding_backward(dtable.data(), dout.data(), idx.data(), B * T, C, V);
    return std::vector<Vec>{out, dwte, dwpe, dtable};
  });
}

}  // namespace
}  // namespace meshtrain::cpu::testing
