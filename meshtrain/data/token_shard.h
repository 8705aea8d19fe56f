// Token shards in llm.c's .bin format, so datasets prepared by llm.c's scripts train here and
// ours train there. Layout: a header of 256 little-endian int32 (magic, version, token count,
// then zeros) followed by the tokens.
//   magic 20240520, version 1: tokens are uint16 (GPT-2 style vocabularies)
//   magic 20240801, version 7: tokens are uint32 (llm.c's llama-3 files)
// Other versions are rejected. Reading maps the file; tokens are never copied wholesale.
// Our writer also fills two of the header's zeros, which llm.c ignores: int 3 holds the tag
// kShardMaxTokenTag and int 4 the largest token id (-1 for an empty shard), so that a run can
// check the data against its vocabulary without reading every token. Shards without the tag
// (llm.c's, or ours from before) are scanned once instead.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "meshtrain/data/mapped_file.h"

namespace meshtrain::data {

inline constexpr int32_t kShardMagicU16 = 20240520;
inline constexpr int32_t kShardVersionU16 = 1;
inline constexpr int32_t kShardMagicU32 = 20240801;
inline constexpr int32_t kShardVersionU32 = 7;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;
inline constexpr int32_t kShardMaxTokenTag = 0x4449584d;  // 'MXID'

enum class TokenWidth { u16, u32 };

// What a shard's header and its size say, before its tokens are read: enough to count its
// windows and check its vocabulary while the tokens are still on object storage.
struct ShardHeader {
  int64_t num_tokens = 0;
  TokenWidth width = TokenWidth::u16;
  std::optional<int64_t> max_token;  // where the writer recorded it
};

// Parses the first kShardHeaderBytes of a shard whose whole size is `file_size`: validates
// magic, version and the size against the token count. IoError naming `name` otherwise.
ShardHeader parse_shard_header(const uint8_t* bytes, size_t n, uint64_t file_size,
                               const std::string& name);

// Writes atomically (temporary file + rename). Tokens must fit the width: [0, 65535] for u16
// (ValueError naming the first offending token otherwise).
void write_token_shard(const std::string& path, std::span<const int32_t> tokens,
                       TokenWidth width = TokenWidth::u16);

class TokenShard {
 public:
  // Validates magic, version and size against the header; IoError naming the file otherwise.
  explicit TokenShard(const std::string& path);

  const std::string& path() const { return file_.path(); }
  int64_t size() const { return header_.num_tokens; }
  TokenWidth width() const { return header_.width; }
  const ShardHeader& header() const { return header_; }
  int32_t operator[](int64_t i) const;
  // The largest token id in the shard (-1 when empty): from the header where it is recorded,
  // otherwise one pass over the mapped tokens (then remembered).
  int64_t max_token() const;
  bool max_token_recorded() const { return header_.max_token.has_value(); }
  // Copies tokens [start, start + out.size()) into out, widening to int32.
  void read(int64_t start, std::span<int32_t> out) const;

 private:
  MappedFile file_;
  ShardHeader header_;
  mutable std::optional<int64_t> max_token_;  // recorded, or found by the first scan
};

}  // namespace meshtrain::data
