// The TcpStore wire protocol: one framed request, one framed reply. Requests carry the store
// operation as the frame type; replies are kOk (operation-specific payload), kTimeout or kError
// (a message). The decoder checks every length and count against the bytes actually present
// before allocating, and throws CommError on anything malformed; it is fuzzed.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "meshtrain/comm/store.h"

namespace meshtrain::comm {

enum class StoreOp : uint16_t {
  kSet = 1,
  kGet = 2,
  kAdd = 3,
  kCompareSet = 4,
  kWait = 5,
  kRemove = 6,
  kCheck = 7,
};

enum class StoreReply : uint16_t {
  kOk = 100,
  kTimeout = 101,
  kError = 102,
};

// Keys and values above these sizes are refused by both sides.
constexpr uint32_t kMaxStoreKeyBytes = 64u << 10;
constexpr uint32_t kMaxStoreKeys = 1u << 16;

struct StoreRequest {
  StoreOp op = StoreOp::kGet;
  std::vector<std::string> keys;  // one key except for kWait and kCheck
  Bytes value;                    // kSet: the value; kCompareSet: the desired value
  Bytes expected;                 // kCompareSet
  int64_t delta = 0;              // kAdd
  int64_t timeout_ms = 0;         // kGet, kWait
};

Bytes encode_store_request(const StoreRequest& request);
StoreRequest decode_store_request(uint16_t frame_type, std::span<const uint8_t> payload);

// Little-endian append-only encoder used for request and reply payloads.
class WireWriter {
 public:
  void u8(uint8_t v) { out_.push_back(v); }
  void u32(uint32_t v);
  void i64(int64_t v);
  void bytes(const uint8_t* data, size_t size);  // u32 length + data
  void bytes(const Bytes& b) { bytes(b.data(), b.size()); }
  void str(const std::string& s) { bytes(reinterpret_cast<const uint8_t*>(s.data()), s.size()); }
  Bytes take() { return std::move(out_); }

 private:
  Bytes out_;
};

// Bounds-checked decoder over a payload; every read throws CommError when the payload is short.
class WireReader {
 public:
  explicit WireReader(std::span<const uint8_t> data) : data_(data) {}
  uint8_t u8();
  uint32_t u32();
  int64_t i64();
  Bytes bytes(uint32_t max_size);
  std::string str(uint32_t max_size);
  size_t remaining() const { return data_.size() - pos_; }
  // Throws unless every byte was consumed.
  void finish() const;

 private:
  void need(size_t n) const;
  std::span<const uint8_t> data_;
  size_t pos_ = 0;
};

}  // namespace meshtrain::comm
