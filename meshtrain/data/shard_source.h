// Where a TokenDataset's shards come from when they are not local files when the dataset is
// built: a dataset on object storage (remote_shards.h) knows every shard's header from the
// start and brings the tokens in as the sampler comes to them.
#pragma once

#include <string>
#include <vector>

namespace meshtrain::data {

class ShardSource {
 public:
  virtual ~ShardSource() = default;
  // The local path of shard `name` (e.g. "train_000003.bin"), waiting until it is there and
  // fetching it first if nobody has. Rethrows what failed fetching it (IoError naming the object).
  virtual std::string require(const std::string& name) = 0;
  // The shards the reader will need next, the most urgent first: brought in the background,
  // before what was expected earlier.
  virtual void expect(const std::vector<std::string>& names) = 0;
  // How messages name the shard (e.g. its URI).
  virtual std::string where(const std::string& name) const = 0;
};

}  // namespace meshtrain::data
