// Shard reading and writing. The host is assumed little-endian (as llm.c assumes); a
// static_assert keeps that assumption from going unnoticed on another platform.
#include "meshtrain/data/token_shard.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <vector>

#include "meshtrain/util/atomic_file.h"
#include "meshtrain/util/error.h"

namespace meshtrain::data {

static_assert(std::endian::native == std::endian::little,
              "token shards assume a little-endian host");

namespace {

constexpr const char* kReprepare = "; re-run `meshtrain data prepare`";

}  // namespace

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, TokenWidth width) {
  const int64_t limit = width == TokenWidth::u16 ? 0xffff : 0x7fffffff;
  MT_CHECK(tokens.size() < (size_t{1} << 31), "token shard ", path, ": ", tokens.size(),
           " tokens exceed the format's int32 count");
  int32_t max_token = -1;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] > limit) {
      MT_THROW(ValueError, "token shard ", path, ": token ", tokens[i], " at position ", i,
               " does not fit a ", width == TokenWidth::u16 ? "uint16" : "uint32", " shard");
    }
    max_token = std::max(max_token, tokens[i]);
  }
  std::array<int32_t, kShardHeaderInts> header{};
  header[0] = width == TokenWidth::u16 ? kShardMagicU16 : kShardMagicU32;
  header[1] = width == TokenWidth::u16 ? kShardVersionU16 : kShardVersionU32;
  header[2] = static_cast<int32_t>(tokens.size());
  header[3] = kShardMaxTokenTag;
  header[4] = max_token;

  AtomicFileWriter out(path);
  out.write(header.data(), sizeof(header));
  constexpr size_t kChunk = 1 << 16;
  std::vector<uint8_t> buf;
  for (size_t begin = 0; begin < tokens.size(); begin += kChunk) {
    size_t n = std::min(kChunk, tokens.size() - begin);
    if (width == TokenWidth::u16) {
      buf.resize(n * 2);
      for (size_t i = 0; i < n; ++i) {
        auto v = static_cast<uint16_t>(tokens[begin + i]);
        std::memcpy(buf.data() + 2 * i, &v, 2);
      }
    } else {
      buf.resize(n * 4);
      for (size_t i = 0; i < n; ++i) {
        auto v = static_cast<uint32_t>(tokens[begin + i]);
        std::memcpy(buf.data() + 4 * i, &v, 4);
      }
    }
    out.write(buf.data(), buf.size());
  }
  out.commit();
}

ShardHeader parse_shard_header(const uint8_t* bytes, size_t n, uint64_t file_size,
                               const std::string& name) {
  if (n < static_cast<size_t>(kShardHeaderBytes) ||
      file_size < static_cast<uint64_t>(kShardHeaderBytes)) {
    MT_THROW(IoError, "token shard ", name, " is truncated: expected at least ", kShardHeaderBytes,
             " bytes of header, file has ", file_size, " bytes", kReprepare);
  }
  int32_t header[5];
  std::memcpy(header, bytes, sizeof(header));
  ShardHeader h;
  if (header[0] == kShardMagicU16) {
    if (header[1] != kShardVersionU16) {
      MT_THROW(IoError, "token shard ", name, ": unsupported version ", header[1], " (magic ",
               kShardMagicU16, " files are read at version ", kShardVersionU16, ", uint16 tokens)");
    }
    h.width = TokenWidth::u16;
  } else if (header[0] == kShardMagicU32) {
    if (header[1] != kShardVersionU32) {
      MT_THROW(IoError, "token shard ", name, ": unsupported version ", header[1], " (magic ",
               kShardMagicU32, " files are read at version ", kShardVersionU32, ", uint32 tokens)");
    }
    h.width = TokenWidth::u32;
  } else {
    MT_THROW(IoError, "token shard ", name, ": bad magic number ", header[0], " (expected ",
             kShardMagicU16, " or ", kShardMagicU32, "); not a token shard");
  }
  if (header[2] < 0) {
    MT_THROW(IoError, "token shard ", name, ": negative token count ", header[2], " in header");
  }
  h.num_tokens = header[2];
  // A recorded maximum that the tokens could not hold is not trusted: the tokens are scanned.
  const int64_t limit = h.width == TokenWidth::u16 ? 0xffff : 0x7fffffff;
  if (header[3] == kShardMaxTokenTag && header[4] >= (h.num_tokens == 0 ? -1 : 0) &&
      header[4] <= limit) {
    h.max_token = header[4];
  }
  const uint64_t elem = h.width == TokenWidth::u16 ? 2 : 4;
  const uint64_t expected =
      static_cast<uint64_t>(kShardHeaderBytes) + static_cast<uint64_t>(h.num_tokens) * elem;
  if (file_size < expected) {
    MT_THROW(IoError, "token shard ", name, " is truncated: header says ", h.num_tokens,
             " tokens, expected ", expected, " bytes, file has ", file_size, " bytes", kReprepare);
  }
  if (file_size > expected) {
    MT_THROW(IoError, "token shard ", name, " is corrupt: header says ", h.num_tokens,
             " tokens, expected ", expected, " bytes, file has ", file_size, " bytes", kReprepare);
  }
  return h;
}

TokenShard::TokenShard(const std::string& path)
    : file_(path), header_(parse_shard_header(file_.data(), file_.size(), file_.size(), path)) {
  max_token_ = header_.max_token;
}

int32_t TokenShard::operator[](int64_t i) const {
  MT_CHECK(i >= 0 && i < header_.num_tokens, "token index ", i, " out of range [0, ",
           header_.num_tokens, ") in ", path());
  const uint8_t* base = file_.data() + kShardHeaderBytes;
  if (header_.width == TokenWidth::u16) {
    uint16_t v;
    std::memcpy(&v, base + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, base + 4 * i, 4);
  return static_cast<int32_t>(v);
}

int64_t TokenShard::max_token() const {
  if (max_token_) return *max_token_;
  int64_t m = -1;
  const uint8_t* base = file_.data() + kShardHeaderBytes;
  if (header_.width == TokenWidth::u16) {
    const auto* p = reinterpret_cast<const uint16_t*>(base);
    for (int64_t i = 0; i < header_.num_tokens; ++i) m = std::max<int64_t>(m, p[i]);
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(base);
    for (int64_t i = 0; i < header_.num_tokens; ++i) m = std::max<int64_t>(m, p[i]);
  }
  max_token_ = m;
  return m;
}

void TokenShard::read(int64_t start, std::span<int32_t> out) const {
  const auto n = static_cast<int64_t>(out.size());
  MT_CHECK(start >= 0 && start + n <= header_.num_tokens, "token range [", start, ", ", start + n,
           ") out of range [0, ", header_.num_tokens, ") in ", path());
  const uint8_t* base = file_.data() + kShardHeaderBytes;
  if (header_.width == TokenWidth::u16) {
    const auto* p = reinterpret_cast<const uint16_t*>(base) + start;  // 1024-byte aligned base
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = p[i];
  } else {
    const auto* p = reinterpret_cast<const uint32_t*>(base) + start;
    for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = static_cast<int32_t>(p[i]);
  }
}

}  // namespace meshtrain::data
