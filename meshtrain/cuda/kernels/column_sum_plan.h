// How column sums cut their rows into chunks (column_sums.cuh): enough blocks of (32 columns,
// chunk) to fill the device, no more. Counting blocks over the columns too bounds the partial
// sums kept between the two kernels: a chunk count taken from the rows alone kept up to 4096 rows
// of partials per column, 820 MB for a 50K-column bias over half a million rows. Host-only, so
// the plan is tested on every machine.
#pragma once

#include <algorithm>
#include <cstdint>

namespace meshtrain::cuda::detail {

struct ColumnSumPlan {
  int64_t chunk_rows = 0;
  int64_t chunks = 0;
};

// Blocks of 32 columns; chunks of at least 128 rows (enough work per block), at most 4096 (the
// grid's y extent) and no more than the ~8192 blocks that fill the largest device several times
// over. N > 0, C > 0.
inline ColumnSumPlan column_sum_plan(int64_t N, int64_t C) {
  constexpr int64_t kMinRows = 128, kMaxChunks = 4096, kTargetBlocks = 8192;
  const int64_t column_blocks = (C + 31) / 32;
  const int64_t wanted = std::clamp<int64_t>(kTargetBlocks / column_blocks, 1, kMaxChunks);
  ColumnSumPlan p;
  p.chunk_rows = std::max(kMinRows, (N + wanted - 1) / wanted);
  p.chunks = (N + p.chunk_rows - 1) / p.chunk_rows;
  return p;
}

}  // namespace meshtrain::cuda::detail
