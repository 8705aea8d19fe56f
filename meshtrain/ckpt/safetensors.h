// safetensors files, the format Hugging Face and PyTorch use for weights: an 8-byte
// little-endian header length N, N bytes of JSON (padded with spaces to a multiple of 8)
//   {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...,
//    "__metadata__": {"key": "value"}}
// then the raw little-endian data, offsets relative to its start. Loading validates the whole
// header (bounded length, JSON, dtypes, shapes, offsets that tile the data exactly) before any
// tensor is allocated, so a corrupt or hostile file is an IoError, never a crash or a huge
// allocation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/tensor/tensor.h"

namespace meshtrain::ckpt {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;
using SafetensorsMetadata = std::map<std::string, std::string>;

inline constexpr uint64_t kMaxSafetensorsHeader = uint64_t{100} << 20;  // 100 MiB

// What was written: the file's size and the xxh3-64 of its bytes, computed while writing so that
// a checkpoint manifest can record them without reading the file back.
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t xxh3 = 0;
};

// Writes path + ".tmp" with SafetensorsWriter, fsyncs and renames (atomic). Tensors are laid
// out in the given order; CUDA tensors are copied to the host first. Duplicate or empty names
// are a ValueError.
FileDigest save_safetensors(const std::string& path, const NamedTensors& tensors,
                            const SafetensorsMetadata& metadata = {});

// One tensor's bytes in host memory, without a Tensor: a checkpoint snapshot is one buffer
// holding many tensors, and the writer needs nothing more than where the bytes are.
struct TensorBytes {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  const void* data = nullptr;  // nbytes bytes, contiguous
  uint64_t nbytes = 0;         // numel(shape) * dtype_size(dtype)
};

// Writes one safetensors file in place (created or truncated, no temporary name), streamed the
// way disks like it: tensor bytes are gathered straight from memory into large writev() calls
// (kWriteChunkBytes, no copy), writeback of each chunk is started as soon as it is queued so the
// disk works while the next one is, and the xxh3 is computed on a second thread while this one
// writes. The file is not durable when write() returns: sync() it before it is made visible.
// Keeping the two apart lets a checkpoint queue all of its files before waiting for the first.
class SafetensorsWriter {
 public:
  static constexpr uint64_t kWriteChunkBytes = uint64_t{8} << 20;

  explicit SafetensorsWriter(std::string path);  // opens; IoError naming the file
  ~SafetensorsWriter();                          // closes; the file stays
  SafetensorsWriter(SafetensorsWriter&& other) noexcept;
  SafetensorsWriter& operator=(SafetensorsWriter&&) = delete;
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // Once per file. ValueError for an empty, reserved or duplicate name (before any byte is
  // written); IoError naming the file (ENOSPC included) when the data cannot be written.
  FileDigest write(const std::vector<TensorBytes>& tensors,
                   const SafetensorsMetadata& metadata = {});
  // fsync, then close; IoError naming the file.
  void sync();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets relative to the data section
  uint64_t end = 0;
};

struct SafetensorsHeader {
  std::vector<SafetensorsEntry> entries;  // in data order
  SafetensorsMetadata metadata;
  uint64_t data_start = 0;  // absolute file offset of the data section
};

// Reads and validates only the header (cheap: for listing and planning a reshard).
SafetensorsHeader read_safetensors_header(const std::string& path);

struct SafetensorsFile {
  NamedTensors tensors;  // in data order (the order they were saved in, for our files)
  SafetensorsMetadata metadata;

  bool contains(const std::string& name) const;
  const Tensor& at(const std::string& name) const;  // ValueError naming a missing tensor
};

SafetensorsFile load_safetensors(const std::string& path);

// Reads one tensor of a file whose header was read by read_safetensors_header, or only rows
// [row_begin, row_end) of its first dimension (row_end = -1: to the end), so that a reshard
// reads just the slice it needs. ValueError for a missing name or a bad row range.
Tensor read_safetensors_tensor(const std::string& path, const SafetensorsHeader& header,
                               const std::string& name, int64_t row_begin = 0,
                               int64_t row_end = -1);

// "F32", "BF16", ... and back; an unknown name is a ValueError.
std::string safetensors_dtype_name(DType dtype);
DType parse_safetensors_dtype(const std::string& name);

}  // namespace meshtrain::ckpt
