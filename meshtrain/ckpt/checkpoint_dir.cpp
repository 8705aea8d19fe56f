// Checkpoint root layout helpers (see checkpoint_dir.h).
#include "meshtrain/ckpt/checkpoint_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>

#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"

namespace meshtrain::ckpt {

namespace fs = std::filesystem;

std::string step_dir_name(int64_t step) {
  MT_CHECK(step >= 0, "negative checkpoint step ", step);
  return "step_" + std::to_string(step);
}

std::optional<int64_t> parse_step_dir_name(const std::string& name) {
  constexpr std::string_view kPrefix = "step_";
  if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0)
    return std::nullopt;
  const char* begin = name.data() + kPrefix.size();
  const char* end = name.data() + name.size();
  if (end - begin > 18) return std::nullopt;
  int64_t step = 0;
  auto [ptr, ec] = std::from_chars(begin, end, step);
  if (ec != std::errc() || ptr != end || step < 0) return std::nullopt;
  if (step_dir_name(step) != name) return std::nullopt;  // no leading zeros or signs
  return step;
}

std::vector<int64_t> list_complete_steps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    if (!entry.is_directory()) continue;
    auto step = parse_step_dir_name(entry.path().filename().string());
    if (step && fs::is_regular_file(entry.path() / kManifestFile)) steps.push_back(*step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<std::string> list_tmp_dirs(const std::string& root) {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(root, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_directory() && name.size() > 4 && name.ends_with(".tmp"))
      out.push_back(entry.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace {

std::optional<std::string> read_pointer(const fs::path& file) {
  std::ifstream in(file);
  if (!in) return std::nullopt;
  std::string line(64, '\0');
  in.read(line.data(), static_cast<std::streamsize>(line.size()));
  line.resize(static_cast<size_t>(in.gcount()));
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\r'))
    line.pop_back();
  if (!parse_step_dir_name(line)) return std::nullopt;
  return line;
}

}  // namespace

std::optional<std::string> read_latest(const std::string& root) {
  return read_pointer(fs::path(root) / kLatestFile);
}

void write_latest(const std::string& root, int64_t step) {
  write_file_atomic((fs::path(root) / kLatestFile).string(), step_dir_name(step) + "\n");
}

std::optional<std::string> read_best(const std::string& root) {
  return read_pointer(fs::path(root) / kBestFile);
}

void write_best(const std::string& root, int64_t step) {
  write_file_atomic((fs::path(root) / kBestFile).string(), step_dir_name(step) + "\n");
}

std::optional<int64_t> read_pointer_step(const std::string& root, const std::string& pointer) {
  auto name = read_pointer(fs::path(root) / pointer);
  if (!name) return std::nullopt;
  return parse_step_dir_name(*name);
}

std::string resolve_checkpoint_dir(const std::string& dir) {
  if (fs::is_regular_file(fs::path(dir) / kManifestFile)) return dir;
  const fs::path as_file(dir);
  if (fs::is_regular_file(as_file) &&
      (as_file.filename() == kLatestFile || as_file.filename() == kBestFile)) {
    auto name = read_pointer(as_file);
    if (!name) MT_THROW(IoError, dir, " does not name a step directory");
    const fs::path step_dir = as_file.parent_path() / *name;
    if (!fs::is_regular_file(step_dir / kManifestFile))
      MT_THROW(IoError, dir, " names ", *name, ", which is not a complete checkpoint (no ",
               step_dir.string(), "/", kManifestFile, ")");
    return step_dir.string();
  }
  if (fs::exists(fs::path(dir) / kLatestFile)) {
    auto latest = read_latest(dir);
    if (!latest) MT_THROW(IoError, dir, "/latest does not name a step directory");
    return (fs::path(dir) / *latest).string();
  }
  MT_THROW(IoError, dir, " is neither a checkpoint step directory (no ", kManifestFile,
           ") nor a checkpoint root (no ", kLatestFile, ")");
}

void fsync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) MT_THROW(IoError, "cannot open directory ", dir, " to sync it");
  (void)::fsync(fd);
  ::close(fd);
}

void remove_dir_safely(const std::string& dir) {
  fs::path p(dir);
  fs::path doomed = p;
  if (!p.filename().string().ends_with(".tmp")) {
    doomed = p.parent_path() / (p.filename().string() + ".deleting.tmp");
    std::error_code ec;
    fs::remove_all(doomed, ec);
    fs::rename(p, doomed, ec);
    if (ec) MT_THROW(IoError, "cannot rename ", dir, " for deletion: ", ec.message());
  }
  std::error_code ec;
  fs::remove_all(doomed, ec);
  if (ec) MT_THROW(IoError, "cannot remove ", doomed.string(), ": ", ec.message());
}

}  // namespace meshtrain::ckpt
