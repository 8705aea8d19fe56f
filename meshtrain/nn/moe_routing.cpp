#include "meshtrain/nn/moe_routing.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "meshtrain/util/error.h"

namespace meshtrain::nn {

namespace {

// Token t's top_k experts over scores + offset (ties to the lower index) into pick[t * top_k + c].
void pick_top_k(const float* scores, const std::vector<double>& offset, int64_t tokens,
                int64_t experts, int64_t top_k, std::vector<int32_t>& pick) {
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = scores + t * experts;
    auto score = [&](int32_t e) { return row[e] + offset[static_cast<size_t>(e)]; };
    int32_t first = 0;
    for (int32_t e = 1; e < static_cast<int32_t>(experts); ++e)
      if (score(e) > score(first)) first = e;
    pick[static_cast<size_t>(t * top_k)] = first;
    if (top_k == 2) {
      int32_t second = first == 0 ? 1 : 0;
      for (int32_t e = 0; e < static_cast<int32_t>(experts); ++e)
        if (e != first && score(e) > score(second)) second = e;
      pick[static_cast<size_t>(t * top_k + 1)] = second;
    }
  }
}

}  // namespace

void balance_batch(float* scores, int64_t tokens, int64_t experts, int64_t top_k) {
  if (tokens == 0 || experts <= top_k) return;
  const auto N = static_cast<size_t>(tokens), E = static_cast<size_t>(experts);
  const double share = static_cast<double>(tokens * top_k) / static_cast<double>(experts);
  const auto target = static_cast<size_t>(std::llround(share));
  // Within 2% of the even share (at least one assignment) is even enough.
  const double slack = std::max(1.0, 0.02 * share);
  std::vector<double> offset(E, 0.0), best = offset, need(N);
  std::vector<int32_t> pick(N * static_cast<size_t>(top_k));
  std::vector<int64_t> count(E);
  double best_spread = std::numeric_limits<double>::infinity();
  // Gauss-Seidel over the experts: each sweep sets every expert's offset, the others' fixed, to
  // the value at which exactly its share of the tokens choose it. A token takes expert e when
  // its score for e plus the offset beats the top_k-th best of its other experts; the offset
  // each token needs is that margin, and the share-th smallest of them is where to cut.
  for (int sweep = 0; sweep < 32; ++sweep) {
    pick_top_k(scores, offset, tokens, experts, top_k, pick);
    std::fill(count.begin(), count.end(), 0);
    for (int32_t e : pick) ++count[static_cast<size_t>(e)];
    double spread = 0;
    for (size_t e = 0; e < E; ++e)
      spread = std::max(spread, std::abs(static_cast<double>(count[e]) - share));
    if (spread < best_spread) {
      best_spread = spread;
      best = offset;
    }
    if (spread <= slack) break;
    for (size_t e = 0; e < E; ++e) {
      for (size_t t = 0; t < N; ++t) {
        const float* row = scores + t * E;
        double first = -std::numeric_limits<double>::infinity(), second = first;
        for (size_t j = 0; j < E; ++j) {
          if (j == e) continue;
          const double v = row[j] + offset[j];
          if (v > first) {
            second = first;
            first = v;
          } else if (v > second) {
            second = v;
          }
        }
        need[t] = (top_k == 1 ? first : second) - row[e];
      }
      std::sort(need.begin(), need.end());
      // target tokens have a margin below the cut, the others above it.
      if (target == 0)
        offset[e] = need[0] - 1.0;
      else if (target >= N)
        offset[e] = need[N - 1] + 1.0;
      else
        offset[e] = 0.5 * (need[target - 1] + need[target]);
    }
  }
  for (size_t t = 0; t < N; ++t)
    for (size_t e = 0; e < E; ++e) scores[t * E + e] += static_cast<float>(best[e]);
}

MoERouting route_tokens(const float* scores, int64_t tokens, int64_t experts, int64_t top_k,
                        int64_t capacity) {
  MT_CHECK(experts > 0 && top_k >= 1 && top_k <= 2 && top_k <= experts, "route_tokens: top_k ",
           top_k, " of ", experts, " experts");
  MoERouting r;
  r.tokens = tokens;
  r.experts = experts;
  r.top_k = top_k;
  r.capacity = capacity;
  const auto E = static_cast<size_t>(experts);
  // pick[t * top_k + c]: token t's c-th choice.
  std::vector<int32_t> pick(static_cast<size_t>(tokens * top_k));
  pick_top_k(scores, std::vector<double>(E, 0.0), tokens, experts, top_k, pick);
  r.chosen.assign(E, 0);
  for (int32_t e : pick) ++r.chosen[static_cast<size_t>(e)];
  // Priority: choice 0 of every token, then choice 1; the cut keeps the first `capacity`.
  std::vector<std::vector<std::pair<int32_t, int32_t>>> per_expert(E);  // (token, choice)
  for (int64_t c = 0; c < top_k; ++c)
    for (int64_t t = 0; t < tokens; ++t) {
      auto& list = per_expert[static_cast<size_t>(pick[static_cast<size_t>(t * top_k + c)])];
      if (capacity >= 0 && static_cast<int64_t>(list.size()) >= capacity) {
        ++r.dropped;
        continue;
      }
      list.emplace_back(static_cast<int32_t>(t), static_cast<int32_t>(c));
    }
  r.offsets.assign(E + 1, 0);
  for (size_t e = 0; e < E; ++e) {
    r.offsets[e + 1] = r.offsets[e] + static_cast<int64_t>(per_expert[e].size());
    for (auto [t, c] : per_expert[e]) {
      r.token.push_back(t);
      r.expert.push_back(static_cast<int32_t>(e));
      r.choice.push_back(c);
    }
  }
  return r;
}

}  // namespace meshtrain::nn
