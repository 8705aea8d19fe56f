// The order a convolution tries cuDNN's algorithms in: deterministic plain-f32 ones first (in the
// heuristics' order), the other deterministic ones, then the rest as the last fallbacks.
#include "meshtrain/cuda/kernels/algorithm_rank.h"

#include <gtest/gtest.h>

namespace meshtrain::cuda {
namespace {

// algo, supported, deterministic, plain math, in the heuristics' order (fastest first).
const std::vector<AlgorithmTraits> kHeuristics = {
    {7, true, false, true},   // fastest, adds with atomics
    {3, true, true, false},   // tensor-op math
    {5, false, true, true},   // not supported for the shape
    {1, true, true, true},    // deterministic, plain f32
    {0, true, true, true},    // the same, slower
    {6, true, false, false},  // atomics and tensor-op math
};

TEST(AlgorithmRank, DeterministicPlainF32FirstThenTheRestAsFallbacks) {
  EXPECT_EQ(rank_algorithms(kHeuristics, false), (std::vector<int>{1, 0, 3, 7, 6}));
}

TEST(AlgorithmRank, Tf32MakesEveryMathModeAsGood) {
  EXPECT_EQ(rank_algorithms(kHeuristics, true), (std::vector<int>{3, 1, 0, 7, 6}));
}

TEST(AlgorithmRank, NothingSupportedRanksNothing) {
  EXPECT_TRUE(rank_algorithms({{2, false, true, true}}, false).empty());
  EXPECT_TRUE(rank_algorithms({}, true).empty());
}

}  // namespace
}  // namespace meshtrain::cuda
