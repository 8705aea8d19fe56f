// The IDX format of MNIST and Fashion-MNIST: a magic of two zero bytes, a type code and a rank,
// the rank's dimensions as big-endian 32-bit counts, then the values row-major and big-endian.
// Datasets ship these files gzip-compressed; the reader recognises gzip by its first bytes, not
// by the file name, so a file unpacked by hand (or renamed) reads the same.
//
// A file that does not hold exactly one well-formed array is an IoError naming the file, what
// is wrong and what was expected. The header's dimensions are never trusted for an allocation:
// a plain file's data is checked against its size first, and a gzip file's against the most
// deflate can expand it to (1032 times), so a corrupt header cannot ask for terabytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::data {

// The element types IDX defines, by their type code.
enum class IdxType : uint8_t {
  u8 = 0x08,
  i8 = 0x09,
  i16 = 0x0B,
  i32 = 0x0C,
  f32 = 0x0D,
  f64 = 0x0E,
};

std::string_view idx_type_name(IdxType type);  // "u8", "i16", ...
int64_t idx_type_size(IdxType type);           // bytes per element

struct IdxArray {
  IdxType type = IdxType::u8;
  std::vector<int64_t> dims;
  // The values, row-major, each in this machine's byte order.
  std::vector<uint8_t> bytes;

  int64_t count() const;  // the product of dims
  // "60000 x 28 x 28 u8".
  std::string describe() const;
};

// Reads a whole IDX file, plain or gzip-compressed. IoError for a missing or unreadable file, a
// magic that is neither IDX nor gzip, an unknown type code, a rank outside [1, kIdxMaxRank], a
// header or data shorter than it says (with the bytes it has and needs), bytes after the data,
// and corrupt, cut or trailing-garbage gzip.
IdxArray read_idx(const std::string& path);
// The same over a file's bytes already in memory; `path` names the file in messages.
IdxArray parse_idx(std::span<const uint8_t> bytes, const std::string& path);

inline constexpr int kIdxMaxRank = 16;
// Arrays larger than this are refused before any allocation (1 TiB).
inline constexpr int64_t kIdxMaxBytes = int64_t{1} << 40;

}  // namespace meshtrain::data
