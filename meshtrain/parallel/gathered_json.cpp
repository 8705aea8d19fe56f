#include "meshtrain/parallel/gathered_json.h"

#include <algorithm>
#include <string>
#include <vector>

namespace meshtrain::parallel {

nlohmann::json merge_json_objects(const comm::ProcessGroupPtr& group, nlohmann::json mine) {
  if (!group) return mine;
  std::string text = mine.dump();
  const int64_t n = static_cast<int64_t>(text.size());
  std::vector<int64_t> sizes(static_cast<size_t>(group->size()));
  group->all_gather(&n, sizes.data(), 1, DType::i64)->wait();
  const size_t width = static_cast<size_t>(*std::max_element(sizes.begin(), sizes.end()));
  text.resize(width, ' ');
  std::string all(width * sizes.size(), ' ');
  group->all_gather(text.data(), all.data(), width, DType::u8)->wait();
  for (size_t r = 0; r < sizes.size(); ++r) {
    const nlohmann::json theirs = nlohmann::json::parse(all.substr(r * width, width));
    for (const auto& [k, v] : theirs.items()) mine[k] = v;
  }
  return mine;
}

}  // namespace meshtrain::parallel
