// safetensors reading and writing. The reader works from a file descriptor with pread so that
// memory is only allocated for tensors once the header has been proven consistent with the file.
#include "meshtrain/ckpt/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <memory>
#include <set>

#include <xxhash.h>
#include <nlohmann/json.hpp>

#include "meshtrain/util/atomic_file.h"
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

FileDigest save_safetensors(const std::string& path, const NamedTensors& tensors,
                            const SafetensorsMetadata& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  std::set<std::string> seen;
  std::vector<Tensor> host;
  host.reserve(tensors.size());
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    if (name.empty() || name == kMetadataKey) {
      MT_THROW(ValueError, "save_safetensors ", path, ": invalid tensor name '", name, "'");
    }
    if (!seen.insert(name).second) {
      MT_THROW(ValueError, "save_safetensors ", path, ": duplicate tensor name '", name, "'");
    }
    MT_CHECK(tensor.defined(), "save_safetensors ", path, ": tensor '", name, "' is undefined");
    Tensor t = tensor.device().is_cpu() ? tensor : tensor.to(Device::cpu());
    const uint64_t n = t.nbytes();
    header[name] = {{"dtype", safetensors_dtype_name(t.dtype())},
                    {"shape", t.shape()},
                    {"data_offsets", {offset, offset + n}}};
    offset += n;
    host.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();

  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> hash(XXH3_createState(),
                                                                &XXH3_freeState);
  if (!hash) MT_THROW(Error, "out of memory creating an xxh3 state");
  XXH3_64bits_reset(hash.get());
  AtomicFileWriter out(path);
  auto put = [&](const void* data, size_t n) {
    XXH3_64bits_update(hash.get(), data, n);
    out.write(data, n);
  };
  put(&len, sizeof(len));
  put(text.data(), text.size());
  for (const Tensor& t : host) {
    if (t.nbytes() > 0) put(t.data_ptr(), t.nbytes());
  }
  FileDigest digest{out.bytes_written(), XXH3_64bits_digest(hash.get())};
  out.commit();
  return digest;
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
