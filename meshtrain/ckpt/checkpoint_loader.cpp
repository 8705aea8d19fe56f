// Checkpoint verification, fallback and tensor reading (see checkpoint_loader.h).
#include "meshtrain/ckpt/checkpoint_loader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/ckpt/tensor_part.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"
#include "meshtrain/util/log.h"

namespace meshtrain::ckpt {

namespace fs = std::filesystem;

namespace {

// The shape a piece is stored with: replicated, the whole tensor; dim, its slices of each block;
// flat, 1-D.
Shape stored_shape(const TensorRecord& t, const ShardRecord& s) {
  if (t.kind == ShardKind::flat) return {s.length};
  Shape shape = t.shape;
  if (t.kind == ShardKind::dim) shape[static_cast<size_t>(t.dim)] = s.length * t.blocks;
  return shape;
}

// Pieces of dimension 0 without blocks are rows, which read_range reads in part; any other
// split goes through load_slice.
bool row_split(const TensorRecord& t) {
  return t.kind != ShardKind::dim || (t.dim == 0 && t.blocks == 1);
}

// "" when `h` holds t's piece s as the manifest says, else what is wrong.
std::string check_piece(const SafetensorsHeader& h, const TensorRecord& t, const ShardRecord& s) {
  const Shape want = stored_shape(t, s);
  for (const SafetensorsEntry& e : h.entries) {
    if (e.name != t.name) continue;
    if (e.dtype == t.dtype && e.shape == want) return "";
    return "tensor '" + t.name + "' is " + std::string(dtype_name(e.dtype)) + " " +
           shape_str(e.shape) + ", the manifest expects " + std::string(dtype_name(t.dtype)) + " " +
           shape_str(want);
  }
  return "no tensor '" + t.name + "', which the manifest places here";
}

std::vector<std::string> verify_files(const Manifest& m, const std::string& step_dir) {
  std::vector<std::string> problems;
  std::set<std::string> intact;  // files whose size and xxh3 match
  const std::string dir_name = fs::path(step_dir).filename().string();
  if (auto step = parse_step_dir_name(dir_name); step && *step != m.step)
    problems.push_back(std::string(kManifestFile) + ": records step " + std::to_string(m.step) +
                       " but the directory is " + dir_name);
  for (const FileRecord& f : m.files) {
    const fs::path path = fs::path(step_dir) / f.name;
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) {
      problems.push_back(f.name + ": missing (" + ec.message() + ")");
      continue;
    }
    if (size != f.bytes) {
      problems.push_back(f.name + ": " + std::to_string(size) + " bytes, the manifest says " +
                         std::to_string(f.bytes) + (size < f.bytes ? " (truncated)" : ""));
      continue;
    }
    try {
      const uint64_t h = xxh3_64_file(path.string());
      if (h != f.xxh3)
        problems.push_back(f.name + ": xxh3 " + hash_hex(h) + " does not match the manifest's " +
                           hash_hex(f.xxh3) + " (corrupt)");
      else
        intact.insert(f.name);
    } catch (const Error& e) {
      problems.push_back(f.name + ": " + e.what());
    }
  }
  // Every piece is where the manifest says, with its dtype and shape, so that no loader
  // allocates a tensor its files cannot fill (the headers are small; the data is not read).
  std::map<std::string, SafetensorsHeader> headers;
  for (const TensorRecord& t : m.tensors) {
    for (const ShardRecord& s : t.shards) {
      if (!intact.count(s.file)) continue;
      auto it = headers.find(s.file);
      try {
        if (it == headers.end())
          it = headers
                   .emplace(s.file, read_safetensors_header((fs::path(step_dir) / s.file).string()))
                   .first;
      } catch (const Error& e) {
        problems.push_back(s.file + ": " + e.what());
        intact.erase(s.file);
        continue;
      }
      if (std::string p = check_piece(it->second, t, s); !p.empty())
        problems.push_back(s.file + ": " + p);
    }
  }
  return problems;
}

}  // namespace

std::vector<std::string> verify_checkpoint(const std::string& step_dir) {
  Manifest m;
  try {
    m = read_manifest(step_dir);
  } catch (const Error& e) {
    return {std::string(kManifestFile) + ": " + e.what()};
  }
  return verify_files(m, step_dir);
}

struct Checkpoint::HeaderCache {
  std::mutex mu;
  std::map<std::string, SafetensorsHeader> headers;
};

Checkpoint Checkpoint::open(const std::string& step_dir, bool verify) {
  Checkpoint c;
  c.dir_ = step_dir;
  auto m = std::make_shared<Manifest>(read_manifest(step_dir));
  if (verify) {
    std::vector<std::string> problems = verify_files(*m, step_dir);
    if (!problems.empty())
      MT_THROW(IoError, "checkpoint ", step_dir, " failed verification: ", problems.front(),
               problems.size() > 1
                   ? " (and " + std::to_string(problems.size() - 1) + " more problems)"
                   : std::string());
  }
  c.manifest_ = std::move(m);
  c.headers_ = std::make_shared<HeaderCache>();
  return c;
}

std::vector<std::string> Checkpoint::tensor_names(const std::string& group) const {
  std::vector<std::string> out;
  for (const TensorRecord& t : manifest_->tensors)
    if (group.empty() || t.group == group) out.push_back(t.name);
  return out;
}

const SafetensorsHeader& Checkpoint::header(const std::string& file) const {
  std::lock_guard<std::mutex> lock(headers_->mu);
  auto it = headers_->headers.find(file);
  if (it == headers_->headers.end())
    it = headers_->headers.emplace(file, read_safetensors_header((fs::path(dir_) / file).string()))
             .first;
  return it->second;
}

void Checkpoint::read_range(const TensorRecord& t, int64_t lo, int64_t hi, void* dst) const {
  MT_CHECK(row_split(t), "read_range of '", t.name, "', which is split along dim ", t.dim);
  const bool flat = t.kind == ShardKind::flat;
  const uint64_t esize = dtype_size(t.dtype);
  const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
  const uint64_t unit_bytes = flat ? esize
                              : rows == 0
                                  ? 0
                                  : static_cast<uint64_t>(shape_numel(t.shape) / rows) * esize;
  // The manifest keeps pieces sorted and tiling (validated when it was read), so walking them
  // in order and taking each range once skips exactly the copies and the empty pieces.
  int64_t next = 0;
  for (const ShardRecord& s : t.shards) {
    if (next >= hi) break;
    if (s.length == 0 || s.offset + s.length <= next) continue;
    next = s.offset + s.length;
    const int64_t a = std::max(lo, s.offset), b = std::min(hi, next);
    if (a >= b) continue;
    const std::string path = (fs::path(dir_) / s.file).string();
    const SafetensorsHeader& h = header(s.file);
    // Verified on open; checked again for a Checkpoint opened without verification.
    if (std::string p = check_piece(h, t, s); !p.empty()) MT_THROW(IoError, path, ": ", p);
    Tensor piece = read_safetensors_tensor(path, h, t.name, a - s.offset, b - s.offset);
    if (piece.nbytes() > 0)
      std::memcpy(static_cast<char*>(dst) + static_cast<uint64_t>(a - lo) * unit_bytes,
                  piece.data_ptr(), piece.nbytes());
  }
  if (next < hi)
    MT_THROW(IoError, "checkpoint ", dir_, ": the pieces of '", t.name, "' end at ", next,
             ", before ", hi);
}

Tensor Checkpoint::load_rows(const std::string& name, int64_t offset, int64_t length) const {
  const TensorRecord& t = manifest_->tensor(name);
  MT_CHECK(!t.shape.empty(), "load_rows of the 0-d tensor '", name, "'");
  MT_CHECK(offset >= 0 && length >= 0 && offset + length <= t.shape[0], "rows [", offset, ", ",
           offset + length, ") outside the ", t.shape[0], " rows of '", name, "'");
  if (!row_split(t)) return load_slice(name, 0, offset, offset + length);
  Shape shape = t.shape;
  shape[0] = length;
  Tensor out = Tensor::empty(shape, t.dtype);
  if (t.kind == ShardKind::flat) {
    const int64_t row = shape_numel(t.shape) / std::max<int64_t>(t.shape[0], 1);
    read_range(t, offset * row, (offset + length) * row, out.data_ptr());
  } else {
    read_range(t, offset, offset + length, out.data_ptr());
  }
  return out;
}

Tensor Checkpoint::load_global_tensor(const std::string& name) const {
  const TensorRecord& t = manifest_->tensor(name);
  if (t.kind == ShardKind::flat) {
    Tensor out = Tensor::empty(t.shape, t.dtype);
    read_range(t, 0, out.numel(), out.data_ptr());
    return out;
  }
  if (!row_split(t))
    return load_slice(name, t.dim, 0, t.shape[static_cast<size_t>(t.dim)] / t.blocks, t.blocks);
  if (!t.shape.empty()) return load_rows(name, 0, t.shape[0]);
  const ShardRecord& s = t.shards.front();
  const std::string path = (fs::path(dir_) / s.file).string();
  Tensor out = read_safetensors_tensor(path, header(s.file), name);
  if (out.dtype() != t.dtype || out.shape() != t.shape)
    MT_THROW(IoError, path, ": tensor '", name, "' does not match the manifest");
  return out;
}

Tensor Checkpoint::load_flat_range(const std::string& name, int64_t begin, int64_t end) const {
  const TensorRecord& t = manifest_->tensor(name);
  const int64_t numel = shape_numel(t.shape);
  MT_CHECK(0 <= begin && begin <= end && end <= numel, "elements [", begin, ", ", end,
           ") outside the ", numel, " elements of '", name, "'");
  Tensor out = Tensor::empty({end - begin}, t.dtype);
  if (begin == end) return out;
  if (t.kind == ShardKind::flat) {
    read_range(t, begin, end, out.data_ptr());
    return out;
  }
  const uint64_t esize = dtype_size(t.dtype);
  Tensor src;
  int64_t first = 0;  // the element src starts at
  if (t.shape.empty()) {
    src = load_global_tensor(name);
  } else {
    const int64_t row = numel / t.shape[0];
    const int64_t r0 = begin / row, r1 = (end - 1) / row + 1;
    src = load_rows(name, r0, r1 - r0);
    first = r0 * row;
  }
  std::memcpy(
      out.data_ptr(),
      static_cast<const char*>(src.data_ptr()) + static_cast<uint64_t>(begin - first) * esize,
      out.nbytes());
  return out;
}

Tensor Checkpoint::load_slice(const std::string& name, int64_t dim, int64_t begin, int64_t end,
                              int64_t blocks) const {
  const TensorRecord& t = manifest_->tensor(name);
  const int64_t rank = static_cast<int64_t>(t.shape.size());
  MT_CHECK(dim >= 0 && dim < rank, "checkpoint tensor '", name, "' of shape ", shape_str(t.shape),
           " has no dim ", dim);
  const int64_t whole = t.shape[static_cast<size_t>(dim)];
  MT_CHECK(blocks >= 1 && whole % blocks == 0, "checkpoint tensor '", name, "': ", blocks,
           " blocks do not divide its ", whole, " entries along dim ", dim);
  const int64_t block = whole / blocks;
  MT_CHECK(0 <= begin && begin <= end && end <= block, "entries [", begin, ", ", end,
           ") outside the ", block, " of each block of dim ", dim, " of '", name, "'");
  if (dim == 0 && blocks == 1 && row_split(t)) {
    if (t.kind != ShardKind::flat || begin < end) return load_rows(name, begin, end - begin);
  }
  Shape shape = t.shape;
  shape[static_cast<size_t>(dim)] = (end - begin) * blocks;
  Tensor out = Tensor::empty(shape, t.dtype);
  if (begin == end) return out;
  if (t.kind != ShardKind::dim || t.dim != dim || t.blocks != blocks) {
    // Split another way (or replicated, or flat): from the whole tensor.
    copy_dim_range(load_global_tensor(name), begin, out, 0, end - begin, dim, blocks);
    return out;
  }
  // Split the same way: each piece that overlaps, read once, gives its overlap of every block.
  int64_t next = 0;
  for (const ShardRecord& s : t.shards) {
    if (next >= end) break;
    if (s.length == 0 || s.offset + s.length <= next) continue;
    next = s.offset + s.length;
    const int64_t a = std::max(begin, s.offset), b = std::min(end, next);
    if (a >= b) continue;
    const std::string path = (fs::path(dir_) / s.file).string();
    const SafetensorsHeader& h = header(s.file);
    if (std::string p = check_piece(h, t, s); !p.empty()) MT_THROW(IoError, path, ": ", p);
    const Tensor piece = read_safetensors_tensor(path, h, t.name);
    copy_dim_range(piece, a - s.offset, out, a - begin, b - a, dim, blocks);
  }
  if (next < end)
    MT_THROW(IoError, "checkpoint ", dir_, ": the pieces of '", t.name, "' end at ", next,
             ", before ", end);
  return out;
}

Tensor Checkpoint::load_shard(const std::string& name, int64_t rank, int64_t world) const {
  const TensorRecord& t = manifest_->tensor(name);
  if (t.kind == ShardKind::replicated || t.shape.empty()) return load_global_tensor(name);
  const RowRange r = even_rows(t.shape[0], rank, world);
  return load_rows(name, r.offset, r.length);
}

NamedTensors Checkpoint::load_group(const std::string& group) const {
  NamedTensors out;
  for (const std::string& name : tensor_names(group))
    out.emplace_back(name, load_global_tensor(name));
  return out;
}

CheckpointLoader::CheckpointLoader(std::string root, LoaderOptions options)
    : root_(std::move(root)), options_(options) {}

std::vector<int64_t> CheckpointLoader::candidates() const {
  std::vector<int64_t> steps = list_complete_steps(root_);
  if (options_.max_step >= 0)
    std::erase_if(steps, [&](int64_t s) { return s > options_.max_step; });
  std::reverse(steps.begin(), steps.end());
  std::optional<int64_t> latest;
  if (auto name = read_latest(root_)) latest = parse_step_dir_name(*name);
  if (!latest || std::find(steps.begin(), steps.end(), *latest) == steps.end()) return steps;
  std::vector<int64_t> out{*latest};
  for (int64_t s : steps)
    if (s < *latest) out.push_back(s);
  return out;
}

std::optional<Checkpoint> CheckpointLoader::load_latest() {
  rejections_.clear();
  auto reject = [&](std::string line) {
    MT_LOG_WARN("ckpt", line);
    rejections_.push_back(std::move(line));
  };
  if (options_.remove_tmp_dirs) {
    for (const std::string& dir : list_tmp_dirs(root_)) {
      try {
        remove_dir_safely(dir);
        MT_LOG_INFO("ckpt", "removed the unfinished checkpoint ", dir);
      } catch (const Error& e) {
        MT_LOG_WARN("ckpt", e.what());
      }
    }
  }
  if (fs::exists(fs::path(root_) / kLatestFile)) {
    auto name = read_latest(root_);
    if (!name) {
      reject("checkpoint " + root_ + "/" + kLatestFile +
             " does not name a step directory; using the newest complete checkpoint");
    } else if (!fs::is_regular_file(fs::path(root_) / *name / kManifestFile)) {
      reject("checkpoint " + root_ + "/" + kLatestFile + " names " + *name +
             ", which is missing or incomplete; falling back to an older checkpoint");
    }
  }
  for (int64_t step : candidates()) {
    const std::string dir = (fs::path(root_) / step_dir_name(step)).string();
    std::vector<std::string> problems = verify_checkpoint(dir);
    if (problems.empty()) {
      try {
        Checkpoint c = Checkpoint::open(dir, /*verify=*/false);
        if (!rejections_.empty())
          MT_LOG_WARN("ckpt", "loaded checkpoint ", dir, " after rejecting newer ones");
        return c;
      } catch (const Error& e) {
        problems.push_back(e.what());
      }
    }
    reject("checkpoint " + dir + " failed verification: " + problems.front() +
           (problems.size() > 1 ? " (+" + std::to_string(problems.size() - 1) + " more)" : "") +
           "; falling back to an older checkpoint");
  }
  return std::nullopt;
}

}  // namespace meshtrain::ckpt
