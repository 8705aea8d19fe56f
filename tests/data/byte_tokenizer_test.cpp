// Byte tokenizer: exact round trip of arbitrary bytes, the end-of-text token, invalid ids.
#include "meshtrain/data/byte_tokenizer.h"

#include <gtest/gtest.h>

#include "meshtrain/util/error.h"

namespace meshtrain::data {
namespace {

TEST(ByteTokenizer, RoundTripsEveryByte) {
  ByteTokenizer tok;
  std::string text;
  for (int i = 0; i < 256; ++i) text.push_back(static_cast<char>(i));
  text += "héllo wörld\n\x00\xff";
  std::vector<int32_t> ids = tok.encode(text);
  ASSERT_EQ(ids.size(), text.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
    EXPECT_GE(ids[i], 0);
    EXPECT_LT(ids[i], 256);
  }
  EXPECT_EQ(tok.decode(ids), text);
}

TEST(ByteTokenizer, VocabularyAndEot) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 257);
  EXPECT_EQ(tok.eot_token(), 256);
  std::vector<int32_t> ids = {'a', 256, 'b'};
  EXPECT_EQ(tok.decode(ids), "a<|endoftext|>b");
  EXPECT_TRUE(tok.encode("").empty());
}

TEST(ByteTokenizer, RejectsInvalidIds) {
  ByteTokenizer tok;
  for (int32_t bad : {-1, 257, 1000}) {
    std::vector<int32_t> ids = {'x', bad};
    try {
      tok.decode(ids);
      FAIL() << "id " << bad << " accepted";
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace meshtrain::data
