// The IDX reader: round trips of plain and gzipped files of every type, and one clear IoError
// for each way a file can be wrong.
#include "meshtrain/data/idx_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "meshtrain/util/error.h"
#include "tests/data/idx_test_files.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::data {
namespace {

using idx_files::gzip;
using idx_files::idx_bytes;
using idx_files::idx_u8;
using ::meshtrain::testing::TempDir;
using ::meshtrain::testing::write_bytes;
using ::testing::AllOf;
using ::testing::HasSubstr;

// The message of the IoError that reading `path` throws.
std::string read_error(const std::string& path) {
  try {
    read_idx(path);
  } catch (const IoError& e) {
    return e.what();
  }
  ADD_FAILURE() << "reading " << path << " did not fail";
  return "";
}

// Writes `bytes` to dir/name and returns the path.
std::string put(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.file(name);
  write_bytes(path, bytes);
  return path;
}

TEST(IdxFile, ReadsPlainAndGzippedBytesAlike) {
  TempDir dir;
  std::vector<uint8_t> values(2 * 3 * 4);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(7 * i + 1);
  const std::string raw = idx_u8({2, 3, 4}, values);
  // Detection is by content: neither name says what the file is.
  for (const std::string& path : {put(dir, "plain.gz", raw), put(dir, "packed", gzip(raw))}) {
    const IdxArray a = read_idx(path);
    EXPECT_EQ(a.type, IdxType::u8);
    EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3, 4}));
    EXPECT_EQ(a.count(), 24);
    EXPECT_EQ(a.bytes, values) << path;
    EXPECT_EQ(a.describe(), "2 x 3 x 4 u8");
  }
}

TEST(IdxFile, WideValuesComeInThisMachinesByteOrder) {
  TempDir dir;
  // i32 1, -2, 0x01020304 big-endian.
  const std::string be_i32("\x00\x00\x00\x01\xff\xff\xff\xfe\x01\x02\x03\x04", 12);
  const IdxArray i = read_idx(put(dir, "i32", gzip(idx_bytes(0x0C, {3}, be_i32))));
  ASSERT_EQ(i.type, IdxType::i32);
  ASSERT_EQ(i.bytes.size(), 12u);
  int32_t iv[3];
  std::memcpy(iv, i.bytes.data(), sizeof iv);
  EXPECT_EQ(iv[0], 1);
  EXPECT_EQ(iv[1], -2);
  EXPECT_EQ(iv[2], 0x01020304);

  // f32 1.5 and -0.25, i16 -3, f64 2.0.
  const std::string be_f32("\x3f\xc0\x00\x00\xbe\x80\x00\x00", 8);
  const IdxArray f = read_idx(put(dir, "f32", idx_bytes(0x0D, {1, 2}, be_f32)));
  float fv[2];
  std::memcpy(fv, f.bytes.data(), sizeof fv);
  EXPECT_EQ(fv[0], 1.5f);
  EXPECT_EQ(fv[1], -0.25f);
  const IdxArray s = read_idx(put(dir, "i16", idx_bytes(0x0B, {1}, std::string("\xff\xfd", 2))));
  int16_t sv;
  std::memcpy(&sv, s.bytes.data(), sizeof sv);
  EXPECT_EQ(sv, -3);
  const IdxArray d =
      read_idx(put(dir, "f64", idx_bytes(0x0E, {1}, std::string("\x40\0\0\0\0\0\0\0", 8))));
  double dv;
  std::memcpy(&dv, d.bytes.data(), sizeof dv);
  EXPECT_EQ(dv, 2.0);
  EXPECT_EQ(d.describe(), "1 f64");
}

TEST(IdxFile, ConcatenatedGzipMembersReadAsOneStream) {
  TempDir dir;
  const std::string raw = idx_u8({4, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  const std::string path = put(dir, "two", gzip(raw.substr(0, 11)) + gzip(raw.substr(11)));
  EXPECT_EQ(read_idx(path).bytes, (std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7, 8}));
}

TEST(IdxFile, AnEmptyDimensionIsAnEmptyArray) {
  TempDir dir;
  const IdxArray a = read_idx(put(dir, "empty", idx_u8({0, 28, 28}, {})));
  EXPECT_EQ(a.count(), 0);
  EXPECT_TRUE(a.bytes.empty());
}

TEST(IdxFile, AMissingFileIsNamed) {
  TempDir dir;
  const std::string path = dir.file("absent-idx1-ubyte.gz");
  EXPECT_THAT(read_error(path),
              AllOf(HasSubstr(path + " does not exist"),
                    HasSubstr("expected an IDX file (plain or gzip-compressed)")));
}

TEST(IdxFile, ABadMagicShowsItsBytesAndWhatWasExpected) {
  TempDir dir;
  const std::string zip = put(dir, "zip", std::string("PK\x03\x04 more bytes", 15));
  EXPECT_THAT(read_error(zip),
              AllOf(HasSubstr(zip), HasSubstr("bad magic"), HasSubstr("50 4b 03 04"),
                    HasSubstr("expected an IDX magic"), HasSubstr("or a gzip header (1f 8b)")));
  // The same inside gzip: the decompressed bytes are meant.
  const std::string text = put(dir, "text.gz", gzip("hello, world"));
  EXPECT_THAT(read_error(text), AllOf(HasSubstr(text), HasSubstr("first decompressed bytes are "
                                                                 "68 65 6c 6c")));
  const std::string tiny = put(dir, "tiny", std::string("\0\0", 2));
  EXPECT_THAT(read_error(tiny), AllOf(HasSubstr(tiny), HasSubstr("too short for an IDX file"),
                                      HasSubstr("has 2 bytes, the magic alone needs 4")));
}

TEST(IdxFile, AnUnknownTypeCodeOrRankIsRefused) {
  TempDir dir;
  const std::string type = put(dir, "type", idx_bytes(0x07, {2}, "ab"));
  EXPECT_THAT(read_error(type),
              AllOf(HasSubstr(type), HasSubstr("unsupported IDX type code 07"),
                    HasSubstr("expected 08 (u8), 09 (i8), 0b (i16), 0c (i32), 0d (f32) or 0e")));
  const std::string rank0 = put(dir, "rank0", idx_bytes(0x08, {}, "a"));
  EXPECT_THAT(read_error(rank0), AllOf(HasSubstr(rank0), HasSubstr("IDX rank 0"),
                                       HasSubstr("expected 1 to 16 dimensions")));
}

TEST(IdxFile, TruncatedFilesSayWhatTheyHaveAndNeed) {
  TempDir dir;
  // The header of a rank-3 file is 16 bytes; this one stops after 8.
  const std::string header = put(dir, "header", idx_u8({2, 3, 4}, {}).substr(0, 8));
  EXPECT_THAT(read_error(header), AllOf(HasSubstr(header), HasSubstr("truncated in its header"),
                                        HasSubstr("rank 3 needs 16 header bytes, the file has 8")));

  const std::string raw = idx_u8({2, 3, 4}, std::vector<uint8_t>(20, 9));  // 24 values needed
  const std::string plain = put(dir, "plain", raw);
  EXPECT_THAT(read_error(plain), AllOf(HasSubstr(plain), HasSubstr("is truncated"),
                                       HasSubstr("2 x 3 x 4 u8 array needs 24 bytes of data "
                                                 "after the 16-byte header, the file has 20")));
  const std::string packed = put(dir, "packed", gzip(raw));
  EXPECT_THAT(read_error(packed), AllOf(HasSubstr(packed), HasSubstr("needs 24 bytes"),
                                        HasSubstr("the decompressed file has 20")));

  // A header that claims far more than the file holds fails without allocating it.
  const std::string huge = put(dir, "huge", gzip(idx_u8({100000, 28, 28}, {1, 2, 3})));
  EXPECT_THAT(read_error(huge),
              AllOf(HasSubstr("needs 78400000 bytes"), HasSubstr("decompressed file has 3")));
  const std::string absurd = put(dir, "absurd", idx_u8({65535, 65535, 65535}, {}));
  EXPECT_THAT(read_error(absurd), AllOf(HasSubstr(absurd), HasSubstr("more than 1099511627776")));
}

TEST(IdxFile, BytesAfterTheDataAreTrailingGarbage) {
  TempDir dir;
  const std::string raw = idx_u8({2, 2}, {1, 2, 3, 4}) + "extra";
  for (const std::string& path : {put(dir, "plain", raw), put(dir, "packed", gzip(raw))}) {
    EXPECT_THAT(read_error(path),
                AllOf(HasSubstr(path), HasSubstr("5 bytes of trailing garbage after its 2 x 2 u8"),
                      HasSubstr("to end after 16 bytes (12 of header, 4 of data)")));
  }
}

TEST(IdxFile, CorruptCutOrPaddedGzipIsNamed) {
  TempDir dir;
  std::vector<uint8_t> values(600);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<uint8_t>(i * i);
  const std::string good = gzip(idx_u8({600}, values));

  std::string bad_crc = good;
  bad_crc[bad_crc.size() - 8] = static_cast<char>(bad_crc[bad_crc.size() - 8] ^ 0x55);
  const std::string crc = put(dir, "crc", bad_crc);
  EXPECT_THAT(read_error(crc), AllOf(HasSubstr(crc),
                                     HasSubstr("is corrupt gzip: incorrect data "
                                               "check"),
                                     HasSubstr("expected a valid gzip stream")));
  std::string bad_method = good;
  bad_method[2] = 9;  // the compression method: 8 is deflate
  const std::string method = put(dir, "method", bad_method);
  EXPECT_THAT(read_error(method),
              AllOf(HasSubstr(method), HasSubstr("corrupt gzip: unknown compression method")));

  const std::string cut = put(dir, "cut", good.substr(0, good.size() / 2));
  EXPECT_THAT(read_error(cut),
              AllOf(HasSubstr(cut), HasSubstr("cut gzip file"),
                    HasSubstr("stops after " + std::to_string(good.size() / 2) + " compressed")));

  const std::string padded = put(dir, "padded", good + "junk");
  EXPECT_THAT(read_error(padded), AllOf(HasSubstr(padded),
                                        HasSubstr("4 bytes of trailing garbage after its gzip "
                                                  "stream"),
                                        HasSubstr("expected the file to end with the stream")));
}

}  // namespace
}  // namespace meshtrain::data
