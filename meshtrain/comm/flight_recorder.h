// The flight recorder keeps the last N collectives of one rank (operation, sequence number,
// dtype, count, times, state) so that a hang or a failure can be explained after the fact: the
// dump shows which operation each rank reached and which never finished.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/tensor/dtype.h"

namespace meshtrain::comm {

enum class OpState : uint8_t { queued, running, completed, failed };
std::string_view op_state_name(OpState s);

struct FlightRecord {
  uint64_t seq = 0;
  std::string op;
  DType dtype = DType::u8;
  size_t count = 0;
  std::string algorithm;
  OpState state = OpState::queued;
  std::chrono::system_clock::time_point queued_at{};
  std::chrono::system_clock::time_point started_at{};
  std::chrono::system_clock::time_point ended_at{};
  std::string error;
};

class FlightRecorder {
 public:
  explicit FlightRecorder(size_t capacity = 64) : capacity_(capacity == 0 ? 1 : capacity) {}

  void record_queued(uint64_t seq, std::string op, DType dtype, size_t count);
  void record_started(uint64_t seq, std::string_view algorithm);
  void record_finished(uint64_t seq, bool ok, std::string error = {});

  // Oldest first.
  std::vector<FlightRecord> snapshot() const;
  // A JSON document: {"group":..., "rank":..., "records":[...]}.
  std::string dump_json(const std::string& group, int rank) const;
  // One line per record, for logs.
  std::string dump_text() const;

 private:
  FlightRecord* find(uint64_t seq);

  const size_t capacity_;
  mutable std::mutex mu_;
  std::vector<FlightRecord> ring_;
  size_t next_ = 0;
};

}  // namespace meshtrain::comm
