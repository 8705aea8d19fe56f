// Small IDX files written by the tests themselves: the header bytes, big-endian values and gzip
// (zlib), so the reader is checked against files it did not write.
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace meshtrain::data::idx_files {

// An IDX file: magic (00 00 type rank), big-endian dimensions, then `data` as given.
inline std::string idx_bytes(uint8_t type, const std::vector<uint32_t>& dims,
                             const std::string& data) {
  std::string s{'\0', '\0', static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    s += static_cast<char>(d >> 24);
    s += static_cast<char>(d >> 16);
    s += static_cast<char>(d >> 8);
    s += static_cast<char>(d);
  }
  return s + data;
}

// A u8 IDX file of the given bytes.
inline std::string idx_u8(const std::vector<uint32_t>& dims, const std::vector<uint8_t>& values) {
  return idx_bytes(0x08, dims, std::string(values.begin(), values.end()));
}

// One gzip member holding `raw`. A small window and little memory: the files are tiny, and
// deflate's default quarter-megabyte of state made thousands of them slow.
inline std::string gzip(const std::string& raw) {
  z_stream zs{};
  EXPECT_EQ(deflateInit2(&zs, Z_BEST_SPEED, Z_DEFLATED, 16 + 9, 1, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&zs, static_cast<uLong>(raw.size())), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(raw.data()));
  zs.avail_in = static_cast<uInt>(raw.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  return out;
}

}  // namespace meshtrain::data::idx_files
