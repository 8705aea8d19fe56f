// FlightRecorder: a fixed-size ring of records guarded by a mutex (a few updates per operation).
#include "meshtrain/comm/flight_recorder.h"

#include <nlohmann/json.hpp>
#include <sstream>

namespace meshtrain::comm {
namespace {

double unix_seconds(std::chrono::system_clock::time_point t) {
  if (t.time_since_epoch().count() == 0) return 0.0;
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

}  // namespace

std::string_view op_state_name(OpState s) {
  switch (s) {
    case OpState::queued:
      return "queued";
    case OpState::running:
      return "running";
    case OpState::completed:
      return "completed";
    case OpState::failed:
      return "failed";
  }
  return "?";
}

void FlightRecorder::record_queued(uint64_t seq, std::string op, DType dtype, size_t count) {
  std::lock_guard lock(mu_);
  FlightRecord r;
  r.seq = seq;
  r.op = std::move(op);
  r.dtype = dtype;
  r.count = count;
  r.queued_at = std::chrono::system_clock::now();
  if (ring_.size() < capacity_) {
    ring_.push_back(std::move(r));
  } else {
    ring_[next_] = std::move(r);
  }
  next_ = (next_ + 1) % capacity_;
}

FlightRecord* FlightRecorder::find(uint64_t seq) {
  for (auto& r : ring_) {
    if (r.seq == seq) return &r;
  }
  return nullptr;
}

void FlightRecorder::record_started(uint64_t seq, std::string_view algorithm) {
  std::lock_guard lock(mu_);
  if (FlightRecord* r = find(seq)) {
    r->state = OpState::running;
    r->algorithm = std::string(algorithm);
    r->started_at = std::chrono::system_clock::now();
  }
}

void FlightRecorder::record_finished(uint64_t seq, bool ok, std::string error) {
  std::lock_guard lock(mu_);
  if (FlightRecord* r = find(seq)) {
    r->state = ok ? OpState::completed : OpState::failed;
    r->ended_at = std::chrono::system_clock::now();
    r->error = std::move(error);
  }
}

std::vector<FlightRecord> FlightRecorder::snapshot() const {
  std::lock_guard lock(mu_);
  std::vector<FlightRecord> out;
  out.reserve(ring_.size());
  if (ring_.size() < capacity_) return ring_;
  for (size_t i = 0; i < ring_.size(); ++i) out.push_back(ring_[(next_ + i) % capacity_]);
  return out;
}

std::string FlightRecorder::dump_json(const std::string& group, int rank) const {
  nlohmann::json records = nlohmann::json::array();
  for (const auto& r : snapshot()) {
    records.push_back({{"seq", r.seq},
                       {"op", r.op},
                       {"dtype", dtype_name(r.dtype)},
                       {"count", r.count},
                       {"algorithm", r.algorithm},
                       {"state", op_state_name(r.state)},
                       {"queued_at", unix_seconds(r.queued_at)},
                       {"started_at", unix_seconds(r.started_at)},
                       {"ended_at", unix_seconds(r.ended_at)},
                       {"error", r.error}});
  }
  nlohmann::json doc = {{"group", group}, {"rank", rank}, {"records", records}};
  return doc.dump();
}

std::string FlightRecorder::dump_text() const {
  std::ostringstream os;
  for (const auto& r : snapshot()) {
    double ms = 0;
    if (r.ended_at.time_since_epoch().count() != 0 &&
        r.started_at.time_since_epoch().count() != 0) {
      ms = std::chrono::duration<double, std::milli>(r.ended_at - r.started_at).count();
    }
    os << "  seq " << r.seq << ' ' << r.op << ' ' << dtype_name(r.dtype) << " x" << r.count << ' '
       << op_state_name(r.state);
    if (!r.algorithm.empty()) os << " algo=" << r.algorithm;
    if (ms > 0) os << ' ' << ms << " ms";
    if (!r.error.empty()) os << " error: " << r.error;
    os << '\n';
  }
  return os.str();
}

}  // namespace meshtrain::comm
