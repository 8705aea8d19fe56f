#include "meshtrain/nn/param_info.h"

#include "meshtrain/util/hash.h"
#include "meshtrain/util/splitmix64.h"

namespace meshtrain::nn {

std::string Placement::str() const {
  switch (kind) {
    case Kind::replicate:
      return "Replicate";
    case Kind::shard:
      return "Shard(" + std::to_string(dim) +
             (blocks == 1 ? std::string() : ", blocks=" + std::to_string(blocks)) + ")";
    case Kind::flat_shard:
      return "FlatShard(" + std::to_string(begin) + ", " + std::to_string(end) + ")";
  }
  return "?";
}

Placement ParamInfo::placement(std::string_view dim) const {
  const auto it = placements.find(dim);
  return it == placements.end() ? Placement::replicate() : it->second;
}

Generator param_generator(uint64_t seed, std::string_view global_name) {
  return Generator(splitmix64_key(seed, xxh3_64(global_name.data(), global_name.size())));
}

void init_parameter(Tensor& t, const ParamInit& init, uint64_t seed, std::string_view global_name) {
  switch (init.kind) {
    case ParamInit::Kind::keep:
      return;
    case ParamInit::Kind::zeros:
      t.fill_(0.0f);
      return;
    case ParamInit::Kind::ones:
      if (init.shard.defined()) {
        t.copy_(init.shard.take(Tensor::ones(init.shard.full)));  // padding stays zero
        return;
      }
      t.fill_(1.0f);
      return;
    case ParamInit::Kind::normal: {
      Generator gen = param_generator(seed, global_name);
      if (init.shard.defined()) {
        Tensor whole = Tensor::empty(init.shard.full);
        normal_(whole, gen, 0.0, init.std);
        t.copy_(init.shard.take(whole));
        return;
      }
      normal_(t, gen, 0.0, init.std);
      return;
    }
    case ParamInit::Kind::uniform: {
      Generator gen = param_generator(seed, global_name);
      if (init.shard.defined()) {
        Tensor whole = Tensor::empty(init.shard.full);
        uniform_(whole, gen, -init.bound, init.bound);
        t.copy_(init.shard.take(whole));
        return;
      }
      uniform_(t, gen, -init.bound, init.bound);
      return;
    }
  }
}

}  // namespace meshtrain::nn
