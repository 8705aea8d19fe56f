#include "meshtrain/parallel/param_server/ps_layout.h"

#include <algorithm>
#include <numeric>

#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

namespace {

// The fewest ranges of at most `cap` elements that cover the sizes in order.
int ranges_needed(const std::vector<int64_t>& sizes, int64_t cap) {
  int n = 1;
  int64_t fill = 0;
  for (int64_t s : sizes) {
    if (fill + s > cap && fill > 0) {
      ++n;
      fill = 0;
    }
    fill += s;
  }
  return n;
}

}  // namespace

std::vector<KeyRange> balanced_key_ranges(const std::vector<int64_t>& sizes, int servers) {
  MT_CHECK(servers >= 1, "a parameter server job needs at least one server");
  // The smallest cap under which the greedy cut needs no more than `servers` ranges: greedy
  // with the optimal cap is optimal for contiguous ranges.
  int64_t lo = sizes.empty() ? 0 : *std::max_element(sizes.begin(), sizes.end());
  int64_t hi = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ranges_needed(sizes, mid) <= servers)
      hi = mid;
    else
      lo = mid + 1;
  }
  std::vector<KeyRange> out;
  size_t begin = 0;
  int64_t fill = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    // Cut before i when it would overflow the cap, or when the parameters left are just
    // enough to give every remaining server one.
    const size_t left = sizes.size() - i;
    const size_t servers_left = static_cast<size_t>(servers) - out.size() - 1;
    if (i > begin && servers_left > 0 && (fill + sizes[i] > lo || left <= servers_left)) {
      out.push_back({begin, i});
      begin = i;
      fill = 0;
    }
    fill += sizes[i];
  }
  out.push_back({begin, sizes.size()});
  while (out.size() < static_cast<size_t>(servers)) out.push_back({sizes.size(), sizes.size()});
  return out;
}

PsLayout::PsLayout(int workers_, int servers_, const std::vector<int64_t>& param_sizes)
    : workers(workers_), servers(servers_), ranges(balanced_key_ranges(param_sizes, servers_)) {
  MT_CHECK(workers >= 1, "a parameter server job needs at least one worker");
  param_offset.assign(param_sizes.size() + 1, 0);
  for (size_t i = 0; i < param_sizes.size(); ++i)
    param_offset[i + 1] = param_offset[i] + param_sizes[i];
  total = param_offset.back();
}

int64_t PsLayout::range_offset(int server) const {
  return param_offset[ranges[static_cast<size_t>(server)].begin];
}

int64_t PsLayout::range_size(int server) const {
  const KeyRange& r = ranges[static_cast<size_t>(server)];
  return param_offset[r.end] - param_offset[r.begin];
}

}  // namespace meshtrain::parallel
