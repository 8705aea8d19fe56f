// Length-prefixed messages on a stream socket. A frame is a fixed 12-byte header
//   magic u32 ("MTFR") | type u16 | reserved u16 (zero) | length u32      (little-endian)
// followed by `length` payload bytes. The header is validated against a caller-chosen maximum
// length before any payload memory is allocated, and the decoder itself never allocates or
// throws, so hostile input costs at most one 12-byte buffer. Used by the TcpStore protocol;
// reusable by anything else that exchanges small typed messages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "meshtrain/comm/socket.h"

namespace meshtrain::comm {

constexpr uint32_t kFrameMagic = 0x5246544d;  // "MTFR" read as a little-endian u32
constexpr size_t kFrameHeaderBytes = 12;
constexpr uint32_t kDefaultMaxFrameBytes = 64u << 20;

struct FrameHeader {
  uint16_t type = 0;
  uint32_t length = 0;
};

enum class FrameStatus {
  kOk,
  kNeedMore,     // fewer than kFrameHeaderBytes available
  kBadMagic,     // not a frame (or the stream lost sync)
  kBadReserved,  // reserved field not zero
  kTooLong,      // length above the allowed maximum
};

const char* frame_status_name(FrameStatus status);

// Decodes a header from the first bytes of `data`. Allocation-free and exception-free.
FrameStatus decode_frame_header(const uint8_t* data, size_t size, uint32_t max_length,
                                FrameHeader* out);
void encode_frame_header(const FrameHeader& header, uint8_t out[kFrameHeaderBytes]);

struct Frame {
  uint16_t type = 0;
  std::vector<uint8_t> payload;
};

// Sends header and payload with one send_all. Throws CommError/TimeoutError.
void write_frame(Socket& socket, uint16_t type, const uint8_t* payload, size_t size,
                 const Deadline& deadline);
inline void write_frame(Socket& socket, uint16_t type, const std::vector<uint8_t>& payload,
                        const Deadline& deadline) {
  write_frame(socket, type, payload.data(), payload.size(), deadline);
}

// Reads one frame. A malformed header or a length above max_length throws CommError naming the
// peer, before the payload is allocated.
Frame read_frame(Socket& socket, const Deadline& deadline,
                 uint32_t max_length = kDefaultMaxFrameBytes);

}  // namespace meshtrain::comm
