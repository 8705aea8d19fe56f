// The row chunks of the device's column sums: every row in exactly one chunk, enough blocks for a
// narrow bias, and partial sums bounded for a wide one.
#include "meshtrain/cuda/kernels/column_sum_plan.h"

#include <gtest/gtest.h>

namespace meshtrain::cuda::detail {
namespace {

TEST(ColumnSumPlan, ChunksCoverEveryRowOnce) {
  for (const int64_t N : {1, 127, 128, 129, 8192, 100003, 5000000})
    for (const int64_t C : {1, 32, 33, 768, 3072, 50304}) {
      const ColumnSumPlan p = column_sum_plan(N, C);
      SCOPED_TRACE(std::to_string(N) + " x " + std::to_string(C));
      EXPECT_GE(p.chunk_rows, 1);
      EXPECT_GE(p.chunks * p.chunk_rows, N);
      EXPECT_LT((p.chunks - 1) * p.chunk_rows, N) << "a chunk with no rows";
      EXPECT_LE(p.chunks, 4096) << "the grid's y extent";
    }
}

// GPT-2's bias and layer-norm gradients (8192 rows, 768 to 3072 columns) keep their 64 chunks of
// 128 rows, the split that filled the H200 and whose sums were measured there.
TEST(ColumnSumPlan, ANarrowBiasKeepsEnoughChunksToFillTheDevice) {
  for (const int64_t C : {768, 2304, 3072}) {
    const ColumnSumPlan p = column_sum_plan(8192, C);
    EXPECT_EQ(p.chunk_rows, 128) << C;
    EXPECT_EQ(p.chunks, 64) << C;
  }
  // Few columns and many rows: many chunks.
  EXPECT_EQ(column_sum_plan(1 << 20, 64).chunks, 4096);
}

// The partial sums of a vocabulary-wide bias over half a million rows: the rows alone asked for
// 3907 chunks, 786 MB of partials; counted by blocks, a few MB.
TEST(ColumnSumPlan, AWideBiasKeepsFewPartialSums) {
  const int64_t N = 500000, C = 50304;
  const ColumnSumPlan p = column_sum_plan(N, C);
  const int64_t partial_bytes = p.chunks * C * static_cast<int64_t>(sizeof(float));
  EXPECT_LE(partial_bytes, 2 << 20) << p.chunks << " chunks";
  EXPECT_GE(p.chunks * ((C + 31) / 32), 4096) << "still enough blocks";
}

}  // namespace
}  // namespace meshtrain::cuda::detail
