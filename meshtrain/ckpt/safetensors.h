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

// Writes path + ".tmp", fsyncs and renames (atomic). Tensors are laid out in the given order;
// CUDA tensors are copied to the host first. Duplicate or empty names are a ValueError.
FileDigest save_safetensors(const std::string& path, const NamedTensors& tensors,
                            const SafetensorsMetadata& metadata = {});

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
