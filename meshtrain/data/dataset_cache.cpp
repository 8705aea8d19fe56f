// See dataset_cache.h.
#include "meshtrain/data/dataset_cache.h"

#include <unistd.h>

#include <cctype>
#include <cstdio>

#include "meshtrain/util/error.h"
#include "meshtrain/util/file_lock.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::data {

namespace fs = std::filesystem;

namespace {

bool is_md5_hex(const std::string& etag) {
  if (etag.size() != 32) return false;
  for (const char c : etag)
    if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

}  // namespace

std::vector<ckpt::ObjectInfo> list_dataset(ckpt::ObjectStore& store, const ckpt::ObjectUri& uri) {
  const std::string base = uri.prefix.empty() ? "" : uri.prefix + "/";
  std::vector<ckpt::ObjectInfo> objects;
  bool has_meta = false, has_train = false;
  for (ckpt::ObjectInfo& o : store.list(base)) {
    const std::string name = o.key.substr(base.size());
    if (name.find('/') != std::string::npos || !is_dataset_file(name)) continue;
    has_meta = has_meta || name == kDatasetMetaFile;
    has_train = has_train || name.starts_with("train_");
    objects.push_back(std::move(o));
  }
  const std::string upload_hint =
      " (prepare it with `meshtrain data prepare --out DIR` and copy "
      "DIR's files to " +
      uri.str() + "/)";
  if (!has_meta)
    MT_THROW(IoError, store.uri(uri.key(kDatasetMetaFile)), " is missing: no dataset at ",
             uri.str(), upload_hint);
  if (!has_train) MT_THROW(IoError, "no train_*.bin shards at ", uri.str(), "/", upload_hint);
  return objects;
}

std::string dataset_file_name(const ckpt::ObjectUri& uri, const ckpt::ObjectInfo& object) {
  return object.key.substr(uri.prefix.empty() ? 0 : uri.prefix.size() + 1);
}

bool is_dataset_file(const std::string& name) {
  auto shard = [&](const std::string& split) {
    return name.size() > split.size() + 4 && name.starts_with(split) && name.ends_with(".bin");
  };
  return name == kDatasetMetaFile || shard("train_") || shard("val_");
}

// S3's ETag is the MD5 of the bytes, or "<md5>-<parts>" for a multipart upload.
std::string cached_content_name(const ckpt::ObjectInfo& o) {
  std::string name;
  for (const char c : o.etag)
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '-') name += c;
  if (!name.empty()) return name;
  return "noetag-" + hash_hex(xxh3_64(detail::str_cat(o.key, " ", o.size, " ", o.modified_unix_s)));
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / 1048576.0);
  return buf;
}

bool cached_whole(const fs::path& content, uint64_t size) {
  std::error_code ec;
  return fs::is_regular_file(content, ec) && fs::file_size(content, ec) == size;
}

std::pair<fs::path, bool> cache_object(ckpt::ObjectStore& store, const ckpt::ObjectInfo& object,
                                       const fs::path& root) {
  const std::string name = cached_content_name(object);
  const fs::path content = root / "objects" / name;
  fs::create_directories(root / "objects");
  fs::create_directories(root / "locks");
  const FileLock lock((root / "locks" / (name + ".lock")).string(),
                      " (set MESHTRAIN_S3_CACHE to a writable directory)");
  if (cached_whole(content, object.size)) return {content, false};
  remove_download_leftovers(root / "objects", name + ".");
  download_checked(store, object, content);
  return {content, true};
}

void remove_download_leftovers(const fs::path& dir, const std::string& prefix) {
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with(prefix) && (name.ends_with(".tmp") || name.ends_with(".part")))
      fs::remove(entry.path(), ec);
  }
}

void download_checked(ckpt::ObjectStore& store, const ckpt::ObjectInfo& o, const fs::path& target) {
  const fs::path tmp = target.string() + "." + std::to_string(::getpid()) + ".tmp";
  std::error_code ec;
  try {
    if (!store.get_file(o.key, tmp.string()))
      MT_THROW(IoError, store.uri(o.key),
               " disappeared while the dataset was fetched; start the run again once the upload "
               "is complete");
    const uint64_t size = fs::file_size(tmp);
    const std::string md5 = is_md5_hex(o.etag) ? ckpt::md5_file_hex(tmp.string()) : std::string();
    if (size != o.size || md5 != (is_md5_hex(o.etag) ? o.etag : std::string()))
      MT_THROW(IoError, store.uri(o.key), " is corrupt: received ", size, " bytes",
               md5.empty() ? std::string() : " with MD5 " + md5, ", the server lists ", o.size,
               " bytes", md5.empty() ? std::string() : " with ETag " + o.etag,
               "; upload the file again");
    fs::rename(tmp, target, ec);
    if (ec) MT_THROW(IoError, "cannot rename ", tmp.string(), ": ", ec.message());
  } catch (...) {
    fs::remove(tmp, ec);
    fs::remove(tmp.string() + ".part", ec);
    throw;
  }
}

void place_in_view(const fs::path& content, const fs::path& link) {
  std::error_code ec;
  if (fs::exists(link, ec) && fs::equivalent(link, content, ec)) return;
  const fs::path tmp = link.string() + "." + std::to_string(::getpid()) + ".tmp";
  fs::remove(tmp, ec);
  fs::create_hard_link(content, tmp, ec);
  if (ec) {
    ec.clear();
    fs::copy_file(content, tmp, fs::copy_options::overwrite_existing, ec);
    if (ec)
      MT_THROW(IoError, "cannot place ", link.string(), " in the dataset cache: ", ec.message());
  }
  fs::rename(tmp, link, ec);
  if (ec) MT_THROW(IoError, "cannot rename ", tmp.string(), ": ", ec.message());
}

}  // namespace meshtrain::data
