// Runs the IDX fuzz target on mutated files so that every build exercises the reader's error
// paths, including builds without a fuzzing compiler: valid plain and gzipped files with bytes
// flipped, cut short, or extended, and pure noise.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "fuzz/idx_file_fuzz.cpp"
#include "tests/data/idx_test_files.h"

namespace meshtrain::data {
namespace {

std::string valid_file(std::mt19937_64& rng) {
  const uint8_t types[] = {0x08, 0x09, 0x0B, 0x0C, 0x0D, 0x0E};
  const uint8_t type = types[rng() % 6];
  std::vector<uint32_t> dims(1 + rng() % 3);
  uint64_t count = 1;
  for (uint32_t& d : dims) count *= (d = static_cast<uint32_t>(rng() % 6));
  std::string data(count * static_cast<uint64_t>(idx_type_size(static_cast<IdxType>(type))), '\0');
  for (char& c : data) c = static_cast<char>(rng());
  const std::string raw = idx_files::idx_bytes(type, dims, data);
  return rng() % 2 ? idx_files::gzip(raw) : raw;
}

TEST(IdxFuzzReplay, MutatedFilesParseOrFailWithAnIoError) {
  std::mt19937_64 rng(20261126);
  int parsed = 0;
  for (int run = 0; run < 3000; ++run) {
    std::string bytes = valid_file(rng);
    switch (rng() % 5) {
      case 0:  // unchanged
        break;
      case 1:  // a few bytes flipped
        for (int k = 0, n = 1 + static_cast<int>(rng() % 3); k < n && !bytes.empty(); ++k)
          bytes[rng() % bytes.size()] ^= static_cast<char>(1 + rng() % 255);
        break;
      case 2:  // cut short
        bytes.resize(rng() % (bytes.size() + 1));
        break;
      case 3:  // extended
        bytes += std::string(1 + rng() % 4, static_cast<char>(rng()));
        break;
      default:  // noise
        bytes.assign(rng() % 64, '\0');
        for (char& c : bytes) c = static_cast<char>(rng());
        break;
    }
    const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
    LLVMFuzzerTestOneInput(p, bytes.size());
    try {
      parse_idx({p, bytes.size()}, "input");
      ++parsed;
    } catch (const IoError&) {
    }
  }
  // The unchanged fifth parses (as do data bytes flipped in plain files); the other mutations
  // reach the error paths.
  EXPECT_GT(parsed, 500) << parsed;
  EXPECT_LT(parsed, 1500) << parsed;
}

}  // namespace
}  // namespace meshtrain::data
