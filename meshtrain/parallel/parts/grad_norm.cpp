#include "meshtrain/parallel/parts/grad_norm.h"

#include <cmath>

namespace meshtrain::parallel {

GlobalNorm global_grad_norm(const GradSquares& mine, bool overflow,
                            const comm::ProcessGroupPtr& group) {
  GlobalNorm out;
  if (!group) {
    out.norm = std::sqrt(mine.split + mine.whole);
    out.overflow = overflow;
    out.layers = mine.layers;
    return out;
  }
  // One all-gather carries every rank's two sums, overflow flag and per-layer sums (doubles as
  // their bits), added up in rank order.
  const size_t n = 3 + mine.layers.size();
  std::vector<double> local(n, 0.0);
  local[0] = mine.split;
  local[1] = mine.whole;
  local[2] = overflow ? 1.0 : 0.0;
  for (size_t l = 0; l < mine.layers.size(); ++l) local[3 + l] = mine.layers[l];
  const int world = group->size();
  std::vector<double> each(n * static_cast<size_t>(world));
  group->all_gather(local.data(), each.data(), n, DType::i64)->wait();
  double split = 0.0, whole = 0.0;
  out.layers.assign(mine.layers.size(), 0.0);
  for (int r = 0; r < world; ++r) {
    const double* e = each.data() + n * static_cast<size_t>(r);
    split += e[0];
    whole += e[1];
    out.overflow = out.overflow || e[2] > 0;
    for (size_t l = 0; l < out.layers.size(); ++l) out.layers[l] += e[3 + l];
  }
  out.norm = std::sqrt(split + whole);
  return out;
}

GlobalNorm replicas_mean_norm(const GlobalNorm& mine, const comm::ProcessGroupPtr& replicas) {
  GlobalNorm out = mine;
  const int n = replicas->size();
  const double local[2] = {mine.norm, mine.overflow ? 1.0 : 0.0};
  std::vector<double> each(2 * static_cast<size_t>(n));
  replicas->all_gather(local, each.data(), 2, DType::i64)->wait();
  double sum = 0.0;
  out.overflow = false;
  for (int r = 0; r < n; ++r) {
    sum += each[2 * static_cast<size_t>(r)];  // a non-finite norm stays non-finite
    out.overflow = out.overflow || each[2 * static_cast<size_t>(r) + 1] > 0;
  }
  out.norm = sum / n;
  return out;
}

}  // namespace meshtrain::parallel
