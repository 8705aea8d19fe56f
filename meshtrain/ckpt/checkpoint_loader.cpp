// Checkpoint verification, fallback and tensor reading (see checkpoint_loader.h).
#include "meshtrain/ckpt/checkpoint_loader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/rank_shards.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"
#include "meshtrain/util/log.h"

namespace meshtrain::ckpt {

namespace fs = std::filesystem;

namespace {

std::vector<std::string> verify_files(const Manifest& m, const std::string& step_dir) {
  std::vector<std::string> problems;
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
    } catch (const Error& e) {
      problems.push_back(f.name + ": " + e.what());
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

Tensor Checkpoint::load_rows(const std::string& name, int64_t offset, int64_t length) const {
  const TensorRecord& t = manifest_->tensor(name);
  MT_CHECK(!t.shape.empty(), "load_rows of the 0-d tensor '", name, "'");
  MT_CHECK(offset >= 0 && length >= 0 && offset + length <= t.shape[0], "rows [", offset, ", ",
           offset + length, ") outside the ", t.shape[0], " rows of '", name, "'");
  Shape shape = t.shape;
  shape[0] = length;
  Tensor out = Tensor::empty(shape, t.dtype);
  const uint64_t row_bytes =
      t.shape[0] == 0
          ? 0
          : static_cast<uint64_t>(shape_numel(t.shape) / t.shape[0]) * dtype_size(t.dtype);
  const int64_t end = offset + length;
  int64_t prev_offset = -1;
  for (const ShardRecord& s : t.shards) {
    if (t.kind == ShardKind::dim0 && s.offset == prev_offset) continue;  // another copy
    prev_offset = s.offset;
    const int64_t lo = std::max(offset, s.offset), hi = std::min(end, s.offset + s.length);
    if (lo < hi) {
      const std::string path = (fs::path(dir_) / s.file).string();
      Tensor piece =
          read_safetensors_tensor(path, header(s.file), name, lo - s.offset, hi - s.offset);
      Shape want = shape;
      want[0] = hi - lo;
      if (piece.dtype() != t.dtype || piece.shape() != want)
        MT_THROW(IoError, path, ": tensor '", name, "' is ", dtype_name(piece.dtype()), " ",
                 shape_str(piece.shape()), ", the manifest expects ", dtype_name(t.dtype), " ",
                 shape_str(want));
      if (piece.nbytes() > 0)
        std::memcpy(
            static_cast<char*>(out.data_ptr()) + static_cast<uint64_t>(lo - offset) * row_bytes,
            piece.data_ptr(), piece.nbytes());
    }
    if (t.kind == ShardKind::replicated) break;  // one copy is enough
  }
  return out;
}

Tensor Checkpoint::load_global_tensor(const std::string& name) const {
  const TensorRecord& t = manifest_->tensor(name);
  if (!t.shape.empty()) return load_rows(name, 0, t.shape[0]);
  const ShardRecord& s = t.shards.front();
  const std::string path = (fs::path(dir_) / s.file).string();
  Tensor out = read_safetensors_tensor(path, header(s.file), name);
  if (out.dtype() != t.dtype || out.shape() != t.shape)
    MT_THROW(IoError, path, ": tensor '", name, "' does not match the manifest");
  return out;
}

Tensor Checkpoint::load_shard(const std::string& name, int64_t rank, int64_t world) const {
  const TensorRecord& t = manifest_->tensor(name);
  if (t.kind == ShardKind::replicated) return load_global_tensor(name);
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
