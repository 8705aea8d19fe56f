// The shared-memory size of the simple attention kernels, on every machine: the row buffer must
// hold every 16-byte group that a key of the row falls into, since the compiler's wide loads read
// whole groups (attention_shared.h). With one float per key, T = 37 (the device test's shape) left
// the last group three floats short, which memcheck reported as an invalid __shared__ read.
#include "meshtrain/cuda/kernels/attention_shared.h"

#include <gtest/gtest.h>

#include <cstdint>

#include "meshtrain/util/error.h"

namespace meshtrain::cuda {
namespace {

constexpr size_t kGroupBytes = 16;

TEST(AttentionShared, RowCoversTheLastKeysWholeGroup) {
  for (int64_t T = 1; T <= 12288; ++T) {
    const size_t bytes = attention_row_shared_bytes(T);
    const size_t last_key = static_cast<size_t>(T - 1) * sizeof(float);
    const size_t group_end = (last_key / kGroupBytes + 1) * kGroupBytes;
    ASSERT_GE(bytes, group_end) << "T = " << T;
    ASSERT_EQ(bytes % kGroupBytes, 0u) << "T = " << T;
    // No more than the padding: a whole spare group would waste shared memory.
    ASSERT_LT(bytes, static_cast<size_t>(T) * sizeof(float) + kGroupBytes) << "T = " << T;
  }
}

TEST(AttentionShared, TestShapeIsPadded) {
  EXPECT_EQ(attention_row_floats(37), 40);
  EXPECT_EQ(attention_row_shared_bytes(37), 160u);
  EXPECT_EQ(attention_row_shared_bytes(1024), 4096u);
}

TEST(AttentionShared, RefusesRowsBeyondTheDefaultLimit) {
  EXPECT_EQ(attention_row_shared_bytes(12288), kAttentionRowMaxBytes);
  EXPECT_EQ(attention_row_shared_bytes(12285), kAttentionRowMaxBytes);
  EXPECT_THROW(attention_row_shared_bytes(12289), Error);
  EXPECT_THROW(attention_row_shared_bytes(0), Error);
}

}  // namespace
}  // namespace meshtrain::cuda
