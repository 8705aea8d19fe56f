// safetensors reading and writing. The reader works from a file descriptor with pread so that
// memory is only allocated for tensors once the header has been proven consistent with the file.
// The writer streams (see SafetensorsWriter): checkpoints are written at close to the disk's
// sequential bandwidth only when the bytes go out in large writes with hashing off the I/O path.
#include "meshtrain/ckpt/safetensors.h"

#include <fcntl.h>
#include <limits.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <memory>
#include <set>
#include <utility>

#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/util/error.h"

namespace meshtrain::ckpt {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kMetadataKey = "__metadata__";

class Fd {
 public:
  explicit Fd(const std::string& path) : fd_(::open(path.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ < 0) MT_THROW(IoError, "cannot open ", path, ": ", std::strerror(errno));
  }
  ~Fd() { ::close(fd_); }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

void read_exact(int fd, void* dst, uint64_t nbytes, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(dst);
  while (nbytes > 0) {
    ssize_t n = ::pread(fd, p, nbytes, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      MT_THROW(IoError, "cannot read ", path, ": ", std::strerror(errno));
    }
    if (n == 0) MT_THROW(IoError, "safetensors file ", path, " ended early (truncated)");
    p += n;
    nbytes -= static_cast<uint64_t>(n);
    offset += static_cast<uint64_t>(n);
  }
}

[[noreturn]] void corrupt(const std::string& path, const std::string& what) {
  MT_THROW(IoError, "safetensors file ", path, ": ", what);
}

SafetensorsEntry parse_entry(const std::string& path, const std::string& name, const Json& v,
                             uint64_t data_size) {
  const std::string where = "tensor '" + name + "'";
  if (!v.is_object()) corrupt(path, where + " is not a JSON object");
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!v.contains(key)) corrupt(path, where + " has no \"" + key + "\"");
  }
  SafetensorsEntry e;
  e.name = name;
  if (!v["dtype"].is_string()) corrupt(path, where + " has a non-string dtype");
  const std::string dtype = v["dtype"].get<std::string>();
  try {
    e.dtype = parse_safetensors_dtype(dtype);
  } catch (const ValueError&) {
    corrupt(path, where + " has unsupported dtype '" + dtype +
                      "' (supported: F32, BF16, F16, I32, I64, U8)");
  }
  if (!v["shape"].is_array()) corrupt(path, where + " has a non-array shape");
  // numel is bounded by the data size, so the product cannot overflow before we notice.
  uint64_t numel = 1;
  bool zero = false;
  for (const Json& d : v["shape"]) {
    if (!d.is_number_unsigned()) corrupt(path, where + " has a bad dimension " + d.dump());
    const auto dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX)) corrupt(path, where + " has a huge dimension");
    e.shape.push_back(static_cast<int64_t>(dim));
    if (dim == 0) zero = true;
    if (!zero) {
      if (numel > data_size / dim + 1) {
        corrupt(path, where + " has shape " + v["shape"].dump() + ", larger than the file");
      }
      numel *= dim;
    }
  }
  if (zero) numel = 0;
  const Json& off = v["data_offsets"];
  if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() ||
      !off[1].is_number_unsigned()) {
    corrupt(path, where + " has bad data_offsets " + off.dump());
  }
  e.begin = off[0].get<uint64_t>();
  e.end = off[1].get<uint64_t>();
  if (e.begin > e.end || e.end > data_size) {
    corrupt(path, where + " has data_offsets [" + std::to_string(e.begin) + ", " +
                      std::to_string(e.end) + "] outside the " + std::to_string(data_size) +
                      "-byte data section (truncated file?)");
  }
  const uint64_t expect = numel * dtype_size(e.dtype);
  if (numel > data_size || e.end - e.begin != expect) {
    corrupt(path, where + " has " + std::to_string(e.end - e.begin) + " bytes of data but " +
                      dtype + " shape " + v["shape"].dump() + " needs " +
                      std::to_string(numel > data_size ? 0 : expect));
  }
  return e;
}

}  // namespace

std::string safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "F32";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  MT_THROW(ValueError, "dtype without a safetensors name");
}

DType parse_safetensors_dtype(const std::string& name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8}) {
    if (safetensors_dtype_name(t) == name) return t;
  }
  MT_THROW(ValueError, "unsupported safetensors dtype '", name, "'");
}

namespace {

// Below this a second thread costs more than it saves (rank records, small weight files).
constexpr uint64_t kParallelHashBytes = uint64_t{1} << 20;

uint64_t xxh3_pieces(const std::vector<iovec>& pieces) {
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  if (!state) MT_THROW(Error, "out of memory creating an xxh3 state");
  XXH3_64bits_reset(state.get());
  for (const iovec& p : pieces) XXH3_64bits_update(state.get(), p.iov_base, p.iov_len);
  return XXH3_64bits_digest(state.get());
}

// writev() of every iovec in `iov`, resuming after short writes (a full disk shows up as a short
// write followed by ENOSPC). Advances the iovecs it consumes.
void writev_all(int fd, iovec* iov, size_t count, const std::string& path) {
  while (count > 0) {
    const ssize_t n = ::writev(fd, iov, static_cast<int>(count));
    if (n < 0) {
      if (errno == EINTR) continue;
      MT_THROW(IoError, "cannot write ", path, ": ", std::strerror(errno));
    }
    if (n == 0) MT_THROW(IoError, "cannot write ", path, ": the write made no progress");
    auto left = static_cast<size_t>(n);
    while (count > 0 && left >= iov->iov_len) {
      left -= iov->iov_len;
      ++iov;
      --count;
    }
    if (left > 0) {
      iov->iov_base = static_cast<char*>(iov->iov_base) + left;
      iov->iov_len -= left;
    }
  }
}

// The pieces in order, at most kWriteChunkBytes (and IOV_MAX iovecs) per writev().
void write_pieces(int fd, const std::vector<iovec>& pieces, const std::string& path) {
  std::vector<iovec> chunk;
  size_t next = 0;
  size_t used = 0;  // bytes of pieces[next] already queued
  uint64_t file_offset = 0;
  while (next < pieces.size()) {
    chunk.clear();
    uint64_t chunk_bytes = 0;
    while (next < pieces.size() && chunk_bytes < SafetensorsWriter::kWriteChunkBytes &&
           chunk.size() < static_cast<size_t>(IOV_MAX)) {
      const iovec& p = pieces[next];
      const size_t take = static_cast<size_t>(
          std::min<uint64_t>(p.iov_len - used, SafetensorsWriter::kWriteChunkBytes - chunk_bytes));
      chunk.push_back({static_cast<char*>(p.iov_base) + used, take});
      chunk_bytes += take;
      used += take;
      if (used == p.iov_len) {
        ++next;
        used = 0;
      }
    }
    writev_all(fd, chunk.data(), chunk.size(), path);
    // Start writeback of this chunk now instead of at the final fsync, so that the disk writes
    // while the next chunk is queued. Only a hint: the fsync in sync() reports any failure.
    (void)::sync_file_range(fd, static_cast<off_t>(file_offset), static_cast<off_t>(chunk_bytes),
                            SYNC_FILE_RANGE_WRITE);
    file_offset += chunk_bytes;
  }
}

}  // namespace

SafetensorsWriter::SafetensorsWriter(std::string path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) MT_THROW(IoError, "cannot create ", path_, ": ", std::strerror(errno));
}

SafetensorsWriter::SafetensorsWriter(SafetensorsWriter&& other) noexcept
    : path_(std::move(other.path_)), fd_(std::exchange(other.fd_, -1)) {}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

FileDigest SafetensorsWriter::write(const std::vector<TensorBytes>& tensors,
                                    const SafetensorsMetadata& metadata) {
  MT_CHECK(fd_ >= 0, "write after sync to ", path_);
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const TensorBytes& t : tensors) {
    if (t.name.empty() || t.name == kMetadataKey) {
      MT_THROW(ValueError, "safetensors file ", path_, ": invalid tensor name '", t.name, "'");
    }
    if (!seen.insert(t.name).second) {
      MT_THROW(ValueError, "safetensors file ", path_, ": duplicate tensor name '", t.name, "'");
    }
    uint64_t numel = 1;
    for (int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    MT_CHECK(t.nbytes == numel * dtype_size(t.dtype) && (t.data != nullptr || t.nbytes == 0),
             "safetensors file ", path_, ": tensor '", t.name, "' has ", t.nbytes,
             " bytes for shape ", shape_str(t.shape));
    header[t.name] = {{"dtype", safetensors_dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();
  std::string prefix(sizeof(len), '\0');
  std::memcpy(prefix.data(), &len, sizeof(len));
  prefix += text;

  std::vector<iovec> pieces;
  pieces.reserve(tensors.size() + 1);
  pieces.push_back({prefix.data(), prefix.size()});
  for (const TensorBytes& t : tensors) {
    if (t.nbytes > 0) pieces.push_back({const_cast<void*>(t.data), static_cast<size_t>(t.nbytes)});
  }
  const uint64_t total = prefix.size() + offset;
  FileDigest digest{total, 0};
  if (total < kParallelHashBytes) {
    write_pieces(fd_, pieces, path_);
    digest.xxh3 = xxh3_pieces(pieces);
    return digest;
  }
  // Both threads only read the pieces, so the hash overlaps the whole write. The future's
  // destructor waits for the hash, also when the write throws.
  std::future<uint64_t> hash =
      std::async(std::launch::async, [&pieces] { return xxh3_pieces(pieces); });
  write_pieces(fd_, pieces, path_);
  digest.xxh3 = hash.get();
  return digest;
}

void SafetensorsWriter::sync() {
  MT_CHECK(fd_ >= 0, "sync twice to ", path_);
  if (::fsync(fd_) != 0) MT_THROW(IoError, "cannot fsync ", path_, ": ", std::strerror(errno));
  const int fd = std::exchange(fd_, -1);
  if (::close(fd) != 0) MT_THROW(IoError, "cannot close ", path_, ": ", std::strerror(errno));
}

FileDigest save_safetensors(const std::string& path, const NamedTensors& tensors,
                            const SafetensorsMetadata& metadata) {
  std::vector<Tensor> host;  // keeps host copies of CUDA tensors alive while they are written
  host.reserve(tensors.size());
  std::vector<TensorBytes> bytes;
  bytes.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    MT_CHECK(tensor.defined(), "save_safetensors ", path, ": tensor '", name, "' is undefined");
    host.push_back(tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu()));
    const Tensor& t = host.back();
    bytes.push_back({name, t.dtype(), t.shape(), t.data_ptr(), t.nbytes()});
  }
  const std::string tmp = path + ".tmp";
  try {
    SafetensorsWriter out(tmp);
    const FileDigest digest = out.write(bytes, metadata);
    out.sync();
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      MT_THROW(IoError, "cannot rename ", tmp, " to ", path, ": ", std::strerror(errno));
    std::string dir = std::filesystem::path(path).parent_path().string();
    fsync_dir(dir.empty() ? "." : dir);
    return digest;
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
}

namespace {

SafetensorsHeader read_header(const Fd& fd, const std::string& path) {
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) MT_THROW(IoError, "cannot stat ", path);
  const auto file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    corrupt(path, "only " + std::to_string(file_size) + " bytes, shorter than the 8-byte header");
  }
  uint64_t len = 0;
  read_exact(fd.get(), &len, 8, 0, path);
  if (len > kMaxSafetensorsHeader || len > file_size - 8) {
    corrupt(path, "header length " + std::to_string(len) + " exceeds " +
                      (len > kMaxSafetensorsHeader ? std::string("the 100 MiB limit")
                                                   : "the file size " + std::to_string(file_size)));
  }
  std::string text(len, '\0');
  read_exact(fd.get(), text.data(), len, 8, path);

  // Duplicate keys would silently shadow each other in the parsed object; reject them.
  std::set<std::string> top_keys;
  std::string duplicate;
  Json::parser_callback_t cb = [&](int depth, nlohmann::json::parse_event_t event, Json& parsed) {
    if (depth == 1 && event == nlohmann::json::parse_event_t::key) {
      const auto& key = parsed.get_ref<const std::string&>();
      if (!top_keys.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  Json header;
  try {
    header = Json::parse(text, cb);
  } catch (const nlohmann::json::exception& e) {
    corrupt(path, std::string("header is not valid JSON: ") + e.what());
  }
  if (!header.is_object()) corrupt(path, "header is not a JSON object");
  if (!duplicate.empty()) corrupt(path, "tensor '" + duplicate + "' appears twice in the header");

  SafetensorsHeader out;
  out.data_start = 8 + len;
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) corrupt(path, "__metadata__ is not an object");
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) corrupt(path, "__metadata__ value '" + mk + "' is not a string");
        out.metadata[mk] = mv.get<std::string>();
      }
      continue;
    }
    out.entries.push_back(parse_entry(path, key, value, data_size));
  }
  std::stable_sort(out.entries.begin(), out.entries.end(),
                   [](const auto& a, const auto& b) { return a.begin < b.begin; });
  // The tensors must tile the data section exactly: no overlap, no gap, nothing trailing.
  uint64_t pos = 0;
  for (const SafetensorsEntry& e : out.entries) {
    if (e.begin != pos) {
      corrupt(path, "tensor '" + e.name + "' starts at byte " + std::to_string(e.begin) +
                        " of the data section, expected " + std::to_string(pos) +
                        (e.begin < pos ? " (overlaps the previous tensor)" : " (gap)"));
    }
    pos = e.end;
  }
  if (pos != data_size) {
    corrupt(path, "tensors cover " + std::to_string(pos) + " bytes but the data section has " +
                      std::to_string(data_size));
  }
  return out;
}

}  // namespace

SafetensorsHeader read_safetensors_header(const std::string& path) {
  Fd fd(path);
  return read_header(fd, path);
}

bool SafetensorsFile::contains(const std::string& name) const {
  return std::any_of(tensors.begin(), tensors.end(),
                     [&](const auto& p) { return p.first == name; });
}

const Tensor& SafetensorsFile::at(const std::string& name) const {
  for (const auto& [n, t] : tensors) {
    if (n == name) return t;
  }
  MT_THROW(ValueError, "no tensor '", name, "' in the safetensors file");
}

SafetensorsFile load_safetensors(const std::string& path) {
  Fd fd(path);
  SafetensorsHeader header = read_header(fd, path);
  SafetensorsFile out;
  out.metadata = std::move(header.metadata);
  out.tensors.reserve(header.entries.size());
  for (const SafetensorsEntry& e : header.entries) {
    Tensor t = Tensor::empty(e.shape, e.dtype);
    if (e.end > e.begin)
      read_exact(fd.get(), t.data_ptr(), e.end - e.begin, header.data_start + e.begin, path);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

Tensor read_safetensors_tensor(const std::string& path, const SafetensorsHeader& header,
                               const std::string& name, int64_t row_begin, int64_t row_end) {
  auto it = std::find_if(header.entries.begin(), header.entries.end(),
                         [&](const SafetensorsEntry& e) { return e.name == name; });
  if (it == header.entries.end()) MT_THROW(ValueError, "no tensor '", name, "' in ", path);
  const SafetensorsEntry& e = *it;
  Shape shape = e.shape;
  uint64_t begin = e.begin, nbytes = e.end - e.begin;
  if (row_begin != 0 || row_end != -1) {
    MT_CHECK(!shape.empty(), "row range of the 0-d tensor '", name, "' in ", path);
    const int64_t rows = shape[0];
    if (row_end == -1) row_end = rows;
    MT_CHECK(0 <= row_begin && row_begin <= row_end && row_end <= rows, "rows [", row_begin, ", ",
             row_end, ") outside the ", rows, " rows of '", name, "' in ", path);
    const uint64_t row_bytes = rows == 0 ? 0 : nbytes / static_cast<uint64_t>(rows);
    begin += row_bytes * static_cast<uint64_t>(row_begin);
    nbytes = row_bytes * static_cast<uint64_t>(row_end - row_begin);
    shape[0] = row_end - row_begin;
  }
  Tensor t = Tensor::empty(shape, e.dtype);
  if (nbytes > 0) {
    Fd fd(path);
    read_exact(fd.get(), t.data_ptr(), nbytes, header.data_start + begin, path);
  }
  return t;
}

}  // namespace meshtrain::ckpt
