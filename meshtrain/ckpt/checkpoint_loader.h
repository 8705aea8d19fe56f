// Finding and reading checkpoints. Nothing in a checkpoint is used before every file it lists
// has been checked against the manifest (size, then xxh3). A `latest` checkpoint that fails is
// never loaded silently: the loader logs one line naming the file and the mismatch and falls
// back to the newest older checkpoint that passes.
//
// Tensors are read through the manifest's global view, so a checkpoint written by W ranks loads
// onto any other world size and layout: replicated tensors from any copy, ones split along a
// dimension (tensor parallelism's Shard placements) and flat ones reassembled from their pieces
// and re-sliced, whichever way the reader wants them cut. Only the pieces that overlap the
// requested rows or elements are opened, and only their overlapping part is read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ckpt {

// Problems found in a step directory, one line each ("FILE: what is wrong"); empty when good:
// every listed file has its size and xxh3, and every piece the manifest places in a file is
// there with its dtype and shape. Never throws for content problems.
std::vector<std::string> verify_checkpoint(const std::string& step_dir);

// A verified checkpoint directory, ready to read tensors from. Cheap to copy.
class Checkpoint {
 public:
  // Reads the manifest and (verify = true) checks every file; IoError with the first problem.
  static Checkpoint open(const std::string& step_dir, bool verify = true);

  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return *manifest_; }
  int64_t step() const { return manifest_->step; }
  const nlohmann::json& train_state() const { return manifest_->train_state; }
  // Names of the global tensors of one group ("" = all), in manifest order.
  std::vector<std::string> tensor_names(const std::string& group = "") const;

  // The whole tensor in its global shape, whatever its sharding.
  Tensor load_global_tensor(const std::string& name) const;
  // Global rows [offset, offset + length) of a tensor (any sharding; not for 0-d tensors).
  Tensor load_rows(const std::string& name, int64_t offset, int64_t length) const;
  // Entries [begin, end) along `dim` of each of the `blocks` equal blocks that dimension is made
  // of, block after block, every other dimension whole: what a tensor-parallel rank holds of a
  // Shard(dim, blocks) placement (before padding). From any sharding; a tensor split the same
  // way is read from the pieces that overlap, any other from its whole.
  Tensor load_slice(const std::string& name, int64_t dim, int64_t begin, int64_t end,
                    int64_t blocks = 1) const;
  // Elements [begin, end) of a tensor viewed as 1-D in row-major order, as a 1-D tensor, whatever
  // its sharding: how a ZeRO rank of any world size loads its flat shard. From a replicated or
  // dim-0 tensor it reads the rows that hold the range (at most one partial row at each end
  // more than needed).
  Tensor load_flat_range(const std::string& name, int64_t begin, int64_t end) const;
  // What `rank` of `world` holds under the default layouts: the whole tensor when it was
  // replicated or is 0-d, its even_rows() slice when it was sharded or flat.
  Tensor load_shard(const std::string& name, int64_t rank, int64_t world) const;
  // Every global tensor of a group, e.g. the model's state dict.
  NamedTensors load_group(const std::string& group) const;

 private:
  Checkpoint() = default;
  const SafetensorsHeader& header(const std::string& file) const;
  // Copies units [lo, hi) of `t` to dst: rows of a replicated tensor or of one split in rows
  // (dim 0, no blocks), elements of a flat one, each from one copy of the piece that holds it.
  void read_range(const TensorRecord& t, int64_t lo, int64_t hi, void* dst) const;

  struct HeaderCache;
  std::string dir_;
  std::shared_ptr<const Manifest> manifest_;
  std::shared_ptr<HeaderCache> headers_;
};

struct LoaderOptions {
  bool remove_tmp_dirs = false;  // delete "*.tmp" leftovers (only when no writer is running)
  // Only checkpoints of this step or earlier are candidates (-1 = any): a rollback must not
  // land on a checkpoint taken after the trouble it is escaping began.
  int64_t max_step = -1;
};

class CheckpointLoader {
 public:
  explicit CheckpointLoader(std::string root, LoaderOptions options = {});

  // Candidates in the order they are tried: the step `latest` names, then older complete
  // steps, newest first. Without a usable `latest`, every complete step, newest first.
  std::vector<int64_t> candidates() const;
  // The newest checkpoint that verifies, or nothing when there is none.
  std::optional<Checkpoint> load_latest();
  // The lines logged about rejected checkpoints during the last load_latest().
  const std::vector<std::string>& rejections() const { return rejections_; }

 private:
  std::string root_;
  LoaderOptions options_;
  std::vector<std::string> rejections_;
};

}  // namespace meshtrain::ckpt
