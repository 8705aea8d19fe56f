#include "meshtrain/nn/moe_routing.h"

#include "meshtrain/util/error.h"

namespace meshtrain::nn {

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
  for (int64_t t = 0; t < tokens; ++t) {
    const float* row = scores + t * experts;
    int32_t first = 0;
    for (int32_t e = 1; e < static_cast<int32_t>(experts); ++e)
      if (row[e] > row[first]) first = e;
    pick[static_cast<size_t>(t * top_k)] = first;
    if (top_k == 2) {
      int32_t second = first == 0 ? 1 : 0;
      for (int32_t e = 0; e < static_cast<int32_t>(experts); ++e)
        if (e != first && row[e] > row[second]) second = e;
      pick[static_cast<size_t>(t * top_k + 1)] = second;
    }
  }
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
