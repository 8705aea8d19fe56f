// Fuzz target for the bytes a store server reads from the network: the frame header decoder
// and the store request decoder. Built as a libFuzzer program when the compiler supports it,
// and replayed on random inputs by tests/store/fuzz_replay_test.cpp everywhere else.
//
// Input layout: byte 0 picks the frame length limit, the rest is the stream.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "meshtrain/comm/frame.h"
#include "meshtrain/comm/store_protocol.h"
#include "meshtrain/util/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshtrain::comm;
  if (size == 0) return 0;
  const uint32_t limits[4] = {0, 16, 4096, kDefaultMaxFrameBytes};
  uint32_t max_length = limits[data[0] & 3];
  const uint8_t* p = data + 1;
  size_t left = size - 1;
  while (left > 0) {
    FrameHeader header;
    FrameStatus status = decode_frame_header(p, left, max_length, &header);
    if (status != FrameStatus::kOk) break;
    if (header.length > max_length) std::abort();  // the decoder let an oversized frame through
    p += kFrameHeaderBytes;
    left -= kFrameHeaderBytes;
    if (header.length > left) break;
    std::span<const uint8_t> payload(p, header.length);
    try {
      StoreRequest request = decode_store_request(header.type, payload);
      // Decoding is the inverse of encoding: a request that decodes re-encodes to the same bytes.
      Bytes again = encode_store_request(request);
      if (again.size() != payload.size() ||
          !std::equal(again.begin(), again.end(), payload.begin())) {
        std::abort();
      }
    } catch (const meshtrain::CommError&) {
      // Malformed requests are expected; anything else escaping is a bug.
    }
    p += header.length;
    left -= header.length;
  }
  return 0;
}
