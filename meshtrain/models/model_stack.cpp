#include "meshtrain/models/model_stack.h"

#include <algorithm>
#include <limits>

#include "meshtrain/util/error.h"

namespace meshtrain::models {

std::vector<LayerRange> balanced_ranges(const std::vector<int64_t>& costs, int parts) {
  const size_t L = costs.size();
  MT_CHECK(parts >= 1 && static_cast<size_t>(parts) <= L, "cannot cut ", L, " layers into ", parts,
           " ranges");
  std::vector<int64_t> prefix(L + 1, 0);
  for (size_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + costs[i];
  // best[k][i]: the smallest largest sum cutting the first i layers into k ranges; cut[k][i]:
  // where the last of them begins. Layer counts are small (tens), so O(parts L^2) is nothing.
  constexpr int64_t kInf = std::numeric_limits<int64_t>::max();
  const size_t K = static_cast<size_t>(parts);
  std::vector<std::vector<int64_t>> best(K + 1, std::vector<int64_t>(L + 1, kInf));
  std::vector<std::vector<size_t>> cut(K + 1, std::vector<size_t>(L + 1, 0));
  best[0][0] = 0;
  for (size_t k = 1; k <= K; ++k)
    for (size_t i = k; i <= L; ++i)
      for (size_t j = k - 1; j < i; ++j) {
        if (best[k - 1][j] == kInf) continue;
        const int64_t v = std::max(best[k - 1][j], prefix[i] - prefix[j]);
        if (v < best[k][i]) {
          best[k][i] = v;
          cut[k][i] = j;
        }
      }
  std::vector<LayerRange> out(K);
  size_t end = L;
  for (size_t k = K; k >= 1; --k) {
    out[k - 1] = {cut[k][end], end};
    end = cut[k][end];
  }
  return out;
}

const char* partition_cost_name(PartitionCost cost) {
  return cost == PartitionCost::flops ? "flops" : "params";
}

PartitionCost parse_partition_cost(const std::string& name) {
  if (name == "flops") return PartitionCost::flops;
  if (name == "params") return PartitionCost::params;
  MT_THROW(ValueError, "parallel.partition = \"", name,
           "\" is not a partition cost; use \"flops\" or \"params\"");
}

int64_t layer_cost(const LayerSpec& layer, PartitionCost cost) {
  return cost == PartitionCost::flops ? layer.flops : layer.params;
}

std::vector<LayerRange> ModelStack::partition(int stages, int chunks, PartitionCost cost) const {
  const std::vector<LayerSpec>& ls = layers();
  MT_CHECK(!ls.empty(), "a model stack without layers");
  if (stages < 1 || chunks < 1)
    MT_THROW(ValueError, "parallel.pp (", stages, ") and parallel.virtual_stages (", chunks,
             ") must be at least 1");
  const size_t parts = static_cast<size_t>(stages) * static_cast<size_t>(chunks);
  if (parts > ls.size())
    MT_THROW(ValueError, "parallel.pp (", stages, ") x parallel.virtual_stages (", chunks,
             ") = ", parts, " pipeline pieces, but the model has only ", ls.size(), " layers (",
             ls.front().name, " ... ", ls.back().name,
             "); lower parallel.pp or parallel.virtual_stages, or add layers");
  std::vector<int64_t> costs;
  for (const LayerSpec& l : ls) costs.push_back(layer_cost(l, cost));
  return balanced_ranges(costs, static_cast<int>(parts));
}

}  // namespace meshtrain::models
