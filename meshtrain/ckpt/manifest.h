// manifest.json: the one file that describes a checkpoint. It names every global tensor (shape,
// dtype, how it is split across ranks and which file holds each piece), the caller's training
// state, the world layout that wrote it, and the size and xxh3 of every other file, so that a
// loader can prove the checkpoint complete before trusting a byte of it and can reassemble or
// re-slice tensors for a different world size. A tensor is stored replicated, as ranges of one
// dimension (tensor parallelism's Shard{dim} placements, row-sharded state; a dimension made of
// stacked equal blocks, like the packed q, k and v rows, is split block by block) or as element
// ranges of the tensor viewed as 1-D in row-major order (ZeRO's flat shards, whose bounds ignore
// rows). The manifest
// carries a checksum of its own canonical text, so a damaged manifest is detected like a damaged
// shard.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ckpt {

inline constexpr int64_t kManifestFormatVersion = 1;
inline constexpr const char* kManifestFile = "manifest.json";

enum class ShardKind {
  replicated,  // every holder has the whole tensor; any copy will do
  dim,         // holders have ranges of one dimension (of each of its blocks) that tile it
  flat,        // holders have 1-D element ranges of the row-major tensor that tile it
};

// One stored piece. replicated: offset 0, length the first dimension (1 for a 0-d tensor);
// dim: entries [offset, offset + length) of dimension `dim` within each of its `blocks` equal
// blocks, stored with the global shape but `blocks * length` entries along `dim` (block after
// block); flat: elements [offset, offset + length), stored as a 1-D tensor of `length` elements.
struct ShardRecord {
  int64_t rank = 0;
  std::string file;  // relative to the step directory
  int64_t offset = 0;
  int64_t length = 0;
};

struct TensorRecord {
  std::string name;   // unique across the checkpoint
  std::string group;  // the file family: "model", "optim", ...
  DType dtype = DType::f32;
  Shape shape;  // the global shape
  ShardKind kind = ShardKind::replicated;
  int64_t dim = 0;     // kind dim: the dimension the pieces split
  int64_t blocks = 1;  // kind dim: shape[dim] is `blocks` equal blocks, each split alike
  // replicated: the copies. dim and flat: ordered by (offset, length), covering
  // [0, shape[dim] / blocks) or [0, numel) elements exactly; identical ranges held by several
  // ranks are alternative copies, and empty pieces (a rank whose range missed the tensor) cover
  // nothing.
  std::vector<ShardRecord> shards;
};

struct FileRecord {
  std::string name;  // relative to the step directory
  int64_t rank = 0;
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

struct WorldLayout {
  int64_t world_size = 1;
  int64_t dp = 1;
  int64_t tp = 1;
  int64_t pp = 1;
  int64_t zero_stage = 0;

  friend bool operator==(const WorldLayout&, const WorldLayout&) = default;
};

struct Manifest {
  int64_t format_version = kManifestFormatVersion;
  std::string software_version;
  int64_t step = 0;
  int64_t epoch = 0;
  WorldLayout world;
  std::vector<TensorRecord> tensors;
  std::vector<FileRecord> files;
  nlohmann::json train_state = nlohmann::json::object();

  const TensorRecord* find_tensor(const std::string& name) const;
  const TensorRecord& tensor(const std::string& name) const;  // ValueError naming a missing one
  const FileRecord* find_file(const std::string& name) const;

  nlohmann::ordered_json to_json() const;
  // Validates structure and consistency (shards tile their tensors without gap or overlap, every
  // referenced file is listed, names are safe relative paths); IoError naming `where` and the
  // first problem otherwise. In the JSON a tensor's "sharding" is "replicated" (with "copies"),
  // {"dim": d, "blocks": b (when above 1), "shards": [...]} or {"kind": "flat", "shards": [...]},
  // each shard {"rank", "offset", "length", "file"} in entries of one block of dimension d (dim)
  // or elements (flat).
  static Manifest from_json(const nlohmann::json& j, const std::string& where);
};

// The file text: the manifest followed by "checksum", the xxh3 of the text without it.
std::string manifest_text(const Manifest& m);
// Parses and checks the self-checksum; IoError naming `path` on any problem.
Manifest parse_manifest(const std::string& text, const std::string& path);
Manifest read_manifest(const std::string& step_dir);

std::string shard_kind_name(ShardKind kind);  // "replicated", "dim", "flat"
// The inverse; ValueError for any other name.
ShardKind parse_shard_kind(const std::string& name);
// "model_rank00003.safetensors"
std::string shard_file_name(const std::string& group, int64_t rank);
// A group name is what may appear in a file name: [a-z0-9_]+; ValueError otherwise.
void check_group_name(const std::string& group);

}  // namespace meshtrain::ckpt
