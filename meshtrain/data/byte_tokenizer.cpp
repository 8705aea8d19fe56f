// Byte tokenizer: encode is a widening copy, decode a narrowing one with a range check.
#include "meshtrain/data/byte_tokenizer.h"

#include "meshtrain/util/error.h"

namespace meshtrain::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    int32_t id = ids[i];
    if (id >= 0 && id < 256) {
      out.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    } else if (id == kEotToken) {
      out.append(kEotText);
    } else {
      MT_THROW(ValueError, "byte tokenizer: token id ", id, " at position ", i,
               " is outside the vocabulary [0, ", kVocabSize, ")");
    }
  }
  return out;
}

}  // namespace meshtrain::data
