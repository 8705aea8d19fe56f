// See frame.h. Byte order is fixed (little-endian) so that frames mean the same on every host.
#include "meshtrain/comm/frame.h"

#include <cstring>

#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

uint32_t load_u32(const uint8_t* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint16_t load_u16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
void store_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void store_u16(uint8_t* p, uint16_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
}

}  // namespace

const char* frame_status_name(FrameStatus status) {
  switch (status) {
    case FrameStatus::kOk:
      return "ok";
    case FrameStatus::kNeedMore:
      return "incomplete header";
    case FrameStatus::kBadMagic:
      return "bad frame magic";
    case FrameStatus::kBadReserved:
      return "non-zero reserved field";
    case FrameStatus::kTooLong:
      return "frame length above the limit";
  }
  return "unknown";
}

FrameStatus decode_frame_header(const uint8_t* data, size_t size, uint32_t max_length,
                                FrameHeader* out) {
  if (size < kFrameHeaderBytes) return FrameStatus::kNeedMore;
  if (load_u32(data) != kFrameMagic) return FrameStatus::kBadMagic;
  if (load_u16(data + 6) != 0) return FrameStatus::kBadReserved;
  uint32_t length = load_u32(data + 8);
  if (length > max_length) return FrameStatus::kTooLong;
  out->type = load_u16(data + 4);
  out->length = length;
  return FrameStatus::kOk;
}

void encode_frame_header(const FrameHeader& header, uint8_t out[kFrameHeaderBytes]) {
  store_u32(out, kFrameMagic);
  store_u16(out + 4, header.type);
  store_u16(out + 6, 0);
  store_u32(out + 8, header.length);
}

void write_frame(Socket& socket, uint16_t type, const uint8_t* payload, size_t size,
                 const Deadline& deadline) {
  MT_CHECK(size <= UINT32_MAX, "frame payload too large: ", size, " bytes");
  std::vector<uint8_t> buf(kFrameHeaderBytes + size);
  encode_frame_header(FrameHeader{type, static_cast<uint32_t>(size)}, buf.data());
  if (size > 0) std::memcpy(buf.data() + kFrameHeaderBytes, payload, size);
  socket.send_all(buf.data(), buf.size(), deadline);
}

Frame read_frame(Socket& socket, const Deadline& deadline, uint32_t max_length) {
  uint8_t raw[kFrameHeaderBytes];
  socket.recv_all(raw, sizeof(raw), deadline);
  FrameHeader header;
  FrameStatus status = decode_frame_header(raw, sizeof(raw), max_length, &header);
  if (status != FrameStatus::kOk) {
    MT_THROW(CommError, "bad frame from ", socket.peer(), ": ", frame_status_name(status),
             status == FrameStatus::kTooLong
                 ? detail::str_cat(" (", load_u32(raw + 8), " > ", max_length, ")")
                 : std::string());
  }
  Frame frame;
  frame.type = header.type;
  frame.payload.resize(header.length);
  if (header.length > 0) socket.recv_all(frame.payload.data(), header.length, deadline);
  return frame;
}

}  // namespace meshtrain::comm
