// Which tokens go to which experts: the top-k choice over the router's scores and the capacity
// cut, computed on the host from the router's probabilities. The result is expert-major (every
// expert's tokens are contiguous), which is the order the experts' inputs are gathered in and
// the order an all-to-all sends them to the ranks holding the experts.
//
// Capacity follows GShard and DeepSpeed: every token's first choice is placed before any second
// choice, tokens in their order within a choice, and an assignment past its expert's capacity is
// dropped (the token keeps its other choice, or passes on through the residual connection).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshtrain::nn {

struct MoERouting {
  int64_t tokens = 0;
  int64_t experts = 0;
  int64_t top_k = 1;
  int64_t capacity = -1;  // -1: none (dropless)
  // The kept assignments, expert-major: expert e's are [offsets[e], offsets[e + 1]), each
  // naming its token and its expert, and which of the token's choices it is (0 or 1).
  std::vector<int32_t> token;
  std::vector<int32_t> expert;
  std::vector<int32_t> choice;
  std::vector<int64_t> offsets;  // experts + 1
  // Per expert: assignments chosen before the capacity cut (the load-balancing loss's f_e).
  std::vector<int64_t> chosen;
  int64_t dropped = 0;  // assignments past capacity

  int64_t kept() const { return static_cast<int64_t>(token.size()); }
  int64_t load(int64_t e) const {
    return offsets[static_cast<size_t>(e) + 1] - offsets[static_cast<size_t>(e)];
  }
};

// scores[tokens, experts] (row-major) decide the choice: each token takes its top_k experts
// (ties to the lower index). capacity < 0: keep every assignment.
MoERouting route_tokens(const float* scores, int64_t tokens, int64_t experts, int64_t top_k,
                        int64_t capacity);

// Balances this batch's choice: adds to scores[tokens, experts] one offset per expert such that
// a top_k choice over the result gives every expert its even share of the tokens x top_k
// assignments, to within 2% (or one) where the scores allow. Each sweep sets every expert's
// offset in turn to where exactly its share of the tokens choose it (the others fixed), at most
// 32 sweeps, keeping the most even. A token leaves its preferred expert only when its margin for
// it is among the smallest. Deterministic: the same bits for the same scores.
void balance_batch(float* scores, int64_t tokens, int64_t experts, int64_t top_k);

}  // namespace meshtrain::nn
