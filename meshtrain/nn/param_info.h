// ParamInfo: what the rest of the system needs to know about a parameter besides its values —
// its global name and shape, how it is laid out over each mesh dimension, whether it takes weight
// decay, the tie group it shares values with, and how it is initialised. Checkpoints, the
// sharded optimizers and clipping read it instead of guessing from a tensor's rank or name.
//
// Initial values are drawn from a generator keyed by (seed, global name), never from a stream
// shared by the whole model, so a pipeline stage or an FSDP unit built alone holds exactly the
// values the whole model would.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/nn/tensor_shard.h"
#include "meshtrain/tensor/random.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::nn {

struct ParamInit {
  enum class Kind { keep, zeros, ones, normal, uniform };
  Kind kind = Kind::keep;  // keep: whatever the module put there
  double std = 0.0;        // normal: mean 0
  // Defined when the parameter is a part of a whole tensor (tensor parallelism): the whole is
  // drawn and this part kept, and ParamInfo reports the whole shape and a Shard placement.
  TensorShard shard;
  double bound = 0.0;  // uniform: U(-bound, bound), PyTorch's Kaiming-uniform conv and linear init
  static ParamInit normal(double std) { return {Kind::normal, std, {}}; }
  static ParamInit zeros() { return {Kind::zeros, 0.0, {}}; }
  static ParamInit ones() { return {Kind::ones, 0.0, {}}; }
  static ParamInit uniform(double bound) { return {Kind::uniform, 0.0, {}, bound}; }
};

// How a tensor is laid out over one mesh dimension: whole on every rank; split along `dim` in
// equal parts (tensor parallelism; of each of `blocks` stacked blocks, see TensorShard); or as the
// flat element range [begin, end) of the whole tensor (ZeRO's flat shards, which cut across rows).
struct Placement {
  enum class Kind { replicate, shard, flat_shard };
  Kind kind = Kind::replicate;
  int64_t dim = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int64_t blocks = 1;
  static Placement replicate() { return {}; }
  static Placement shard(int64_t dim, int64_t blocks = 1) {
    return {Kind::shard, dim, 0, 0, blocks};
  }
  static Placement flat_shard(int64_t begin, int64_t end) {
    return {Kind::flat_shard, 0, begin, end, 1};
  }
  // "Replicate", "Shard(0)", "Shard(0, blocks=3)", "FlatShard(128, 256)".
  std::string str() const;
  bool operator==(const Placement&) const = default;
};

struct ParamInfo {
  std::string name;                                          // global: "h.3.attn.c_attn.weight"
  Shape shape;                                               // the whole tensor's
  std::map<std::string, Placement, std::less<>> placements;  // absent dimensions: Replicate
  bool weight_decay = false;  // matrices and embeddings decay; biases and norms do not
  std::string tie_group;      // parameters with the same non-empty group hold the same values
  bool expert = false;        // a mixture-of-experts expert's (sharded over the expert dim)
  ParamInit init;

  Placement placement(std::string_view dim) const;
};

// The generator a parameter's initial values come from.
Generator param_generator(uint64_t seed, std::string_view global_name);

// Draws `t` as `init` prescribes from the keyed generator of `global_name`.
void init_parameter(Tensor& t, const ParamInit& init, uint64_t seed, std::string_view global_name);

}  // namespace meshtrain::nn
