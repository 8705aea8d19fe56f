// See store_protocol.h.
#include "meshtrain/comm/store_protocol.h"

#include "meshtrain/util/error.h"

namespace meshtrain::comm {

void WireWriter::u32(uint32_t v) {
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void WireWriter::i64(int64_t v) {
  auto u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out_.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

void WireWriter::bytes(const uint8_t* data, size_t size) {
  MT_CHECK(size <= UINT32_MAX, "store value too large: ", size, " bytes");
  u32(static_cast<uint32_t>(size));
  out_.insert(out_.end(), data, data + size);
}

void WireReader::need(size_t n) const {
  if (remaining() < n) {
    MT_THROW(CommError, "malformed store message: needs ", n, " more bytes, ", remaining(),
             " left");
  }
}

uint8_t WireReader::u8() {
  need(1);
  return data_[pos_++];
}

uint32_t WireReader::u32() {
  need(4);
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(data_[pos_ + i]) << (8 * i);
  pos_ += 4;
  return v;
}

int64_t WireReader::i64() {
  need(8);
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t(data_[pos_ + i]) << (8 * i);
  pos_ += 8;
  return static_cast<int64_t>(v);
}

Bytes WireReader::bytes(uint32_t max_size) {
  uint32_t n = u32();
  if (n > max_size) MT_THROW(CommError, "malformed store message: field of ", n, " bytes");
  need(n);
  Bytes out(data_.begin() + static_cast<std::ptrdiff_t>(pos_),
            data_.begin() + static_cast<std::ptrdiff_t>(pos_ + n));
  pos_ += n;
  return out;
}

std::string WireReader::str(uint32_t max_size) {
  uint32_t n = u32();
  if (n > max_size) MT_THROW(CommError, "malformed store message: key of ", n, " bytes");
  need(n);
  std::string out(reinterpret_cast<const char*>(data_.data()) + pos_, n);
  pos_ += n;
  return out;
}

void WireReader::finish() const {
  if (remaining() != 0) {
    MT_THROW(CommError, "malformed store message: ", remaining(), " trailing bytes");
  }
}

Bytes encode_store_request(const StoreRequest& r) {
  WireWriter w;
  switch (r.op) {
    case StoreOp::kSet:
      w.str(r.keys.at(0));
      w.bytes(r.value);
      break;
    case StoreOp::kGet:
      w.str(r.keys.at(0));
      w.i64(r.timeout_ms);
      break;
    case StoreOp::kAdd:
      w.str(r.keys.at(0));
      w.i64(r.delta);
      break;
    case StoreOp::kCompareSet:
      w.str(r.keys.at(0));
      w.bytes(r.expected);
      w.bytes(r.value);
      break;
    case StoreOp::kRemove:
      w.str(r.keys.at(0));
      break;
    case StoreOp::kWait:
    case StoreOp::kCheck:
      if (r.op == StoreOp::kWait) w.i64(r.timeout_ms);
      MT_CHECK(r.keys.size() <= kMaxStoreKeys, "too many keys: ", r.keys.size());
      w.u32(static_cast<uint32_t>(r.keys.size()));
      for (const auto& k : r.keys) w.str(k);
      break;
  }
  return w.take();
}

StoreRequest decode_store_request(uint16_t frame_type, std::span<const uint8_t> payload) {
  StoreRequest r;
  WireReader in(payload);
  switch (static_cast<StoreOp>(frame_type)) {
    case StoreOp::kSet:
      r.keys.push_back(in.str(kMaxStoreKeyBytes));
      r.value = in.bytes(UINT32_MAX);
      break;
    case StoreOp::kGet:
      r.keys.push_back(in.str(kMaxStoreKeyBytes));
      r.timeout_ms = in.i64();
      break;
    case StoreOp::kAdd:
      r.keys.push_back(in.str(kMaxStoreKeyBytes));
      r.delta = in.i64();
      break;
    case StoreOp::kCompareSet:
      r.keys.push_back(in.str(kMaxStoreKeyBytes));
      r.expected = in.bytes(UINT32_MAX);
      r.value = in.bytes(UINT32_MAX);
      break;
    case StoreOp::kRemove:
      r.keys.push_back(in.str(kMaxStoreKeyBytes));
      break;
    case StoreOp::kWait:
    case StoreOp::kCheck: {
      if (static_cast<StoreOp>(frame_type) == StoreOp::kWait) r.timeout_ms = in.i64();
      uint32_t count = in.u32();
      // Each key needs at least its 4-byte length, which bounds the count by the payload.
      if (count > kMaxStoreKeys || count > in.remaining() / 4) {
        MT_THROW(CommError, "malformed store message: ", count, " keys");
      }
      r.keys.reserve(count);
      for (uint32_t i = 0; i < count; ++i) r.keys.push_back(in.str(kMaxStoreKeyBytes));
      break;
    }
    default:
      MT_THROW(CommError, "unknown store request type ", frame_type);
  }
  r.op = static_cast<StoreOp>(frame_type);
  if (r.timeout_ms < 0) MT_THROW(CommError, "malformed store message: negative timeout");
  in.finish();
  return r;
}

}  // namespace meshtrain::comm
