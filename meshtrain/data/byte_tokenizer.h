// The byte-level tokenizer: every byte is its own token (ids 0..255) and id 256 marks the end of
// a text. It needs no vocabulary file, so any text trains out of the box and any byte sequence,
// valid UTF-8 or not, round-trips exactly.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace meshtrain::data {

class ByteTokenizer {
 public:
  static constexpr int32_t kEotToken = 256;
  static constexpr int32_t kVocabSize = 257;
  static constexpr std::string_view kEotText = "<|endoftext|>";

  std::string_view name() const { return "byte"; }
  int32_t vocab_size() const { return kVocabSize; }
  int32_t eot_token() const { return kEotToken; }

  std::vector<int32_t> encode(std::string_view text) const;
  // The end-of-text token decodes to kEotText; an id outside [0, vocab_size) is a ValueError.
  std::string decode(std::span<const int32_t> ids) const;
};

}  // namespace meshtrain::data
