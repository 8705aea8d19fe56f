// Runs the store protocol fuzz target on generated inputs so that every build exercises the
// parsers, including builds without a fuzzing compiler. Inputs mix pure noise with valid
// requests that are then mutated, which reaches deeper than noise alone.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "fuzz/store_protocol_fuzz.cpp"

namespace meshtrain::comm {
namespace {

Bytes valid_stream(std::mt19937_64& rng) {
  Bytes out;
  out.push_back(static_cast<uint8_t>(rng() & 3));
  int frames = 1 + static_cast<int>(rng() % 3);
  for (int f = 0; f < frames; ++f) {
    StoreRequest r;
    r.op = static_cast<StoreOp>(1 + rng() % 7);
    int nkeys = (r.op == StoreOp::kWait || r.op == StoreOp::kCheck) ? int(rng() % 4) : 1;
    for (int k = 0; k < nkeys; ++k) r.keys.push_back(std::string(rng() % 8, 'a' + char(k)));
    r.value.resize(rng() % 16, 7);
    if (r.op == StoreOp::kCompareSet) r.expected.resize(rng() % 4, 9);
    r.delta = static_cast<int64_t>(rng());
    r.timeout_ms = static_cast<int64_t>(rng() % 100000);
    Bytes payload = encode_store_request(r);
    uint8_t header[kFrameHeaderBytes];
    encode_frame_header(FrameHeader{static_cast<uint16_t>(r.op), uint32_t(payload.size())}, header);
    out.insert(out.end(), header, header + kFrameHeaderBytes);
    out.insert(out.end(), payload.begin(), payload.end());
  }
  return out;
}

TEST(FuzzReplayTest, RandomAndMutatedInputsNeverCrash) {
  std::mt19937_64 rng(20240611);
  const auto budget = std::chrono::seconds(3);
  const auto start = std::chrono::steady_clock::now();
  size_t runs = 0;
  for (; runs < 200000; ++runs) {
    if ((runs & 1023) == 0 && std::chrono::steady_clock::now() - start > budget) break;
    Bytes input;
    if (runs % 2 == 0) {
      input.resize(rng() % 64);
      for (auto& byte : input) byte = static_cast<uint8_t>(rng());
    } else {
      input = valid_stream(rng);
      int mutations = static_cast<int>(rng() % 4);
      for (int m = 0; m < mutations && !input.empty(); ++m) {
        input[rng() % input.size()] = static_cast<uint8_t>(rng());
      }
      if (rng() % 4 == 0 && !input.empty()) input.resize(rng() % input.size());
    }
    ASSERT_EQ(LLVMFuzzerTestOneInput(input.data(), input.size()), 0);
  }
  EXPECT_GT(runs, 1000u);
}

}  // namespace
}  // namespace meshtrain::comm
