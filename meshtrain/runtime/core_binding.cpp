#include "meshtrain/runtime/core_binding.h"

#include <sched.h>

#include <algorithm>
#include <charconv>

#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

int parse_cpu(std::string_view text, std::string_view whole) {
  int v = -1;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < 0 || v >= CPU_SETSIZE) {
    MT_THROW(ValueError, "bad core list '", whole, "': '", text,
             "' is not a core number (expected e.g. 0-3,8,10-11)");
  }
  return v;
}

}  // namespace

std::vector<int> allowed_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) out.push_back(c);
  }
  return out;
}

std::vector<int> parse_cpu_list(std::string_view text) {
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const size_t dash = item.find('-');
    if (dash == std::string_view::npos) {
      out.push_back(parse_cpu(item, text));
    } else {
      const int lo = parse_cpu(item.substr(0, dash), text);
      const int hi = parse_cpu(item.substr(dash + 1), text);
      if (hi < lo) MT_THROW(ValueError, "bad core list '", text, "': range '", item, "' is empty");
      for (int c = lo; c <= hi; ++c) out.push_back(c);
    }
    start = comma + 1;
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::string format_cpu_list(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cpus[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cpus[j]);
    }
    i = j + 1;
  }
  return out;
}

std::vector<std::vector<int>> split_cpus(const std::vector<int>& cpus, int workers) {
  MT_CHECK(workers >= 1, "cannot split cores between ", workers, " workers");
  if (cpus.size() < static_cast<size_t>(workers)) {
    MT_THROW(ValueError, workers, " workers cannot have a core each: only ", cpus.size(),
             " cores (", format_cpu_list(cpus),
             ") are usable; start fewer workers or drop "
             "--bind-cores-to-rank");
  }
  const size_t k = cpus.size() / static_cast<size_t>(workers);
  std::vector<std::vector<int>> out(static_cast<size_t>(workers));
  for (size_t i = 0; i < out.size(); ++i)
    out[i].assign(cpus.begin() + i * k, cpus.begin() + (i + 1) * k);
  return out;
}

}  // namespace meshtrain::runtime
