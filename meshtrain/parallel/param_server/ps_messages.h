// What a worker and a server say to each other, as fixed-size records sent as bytes over the
// job's process group (point to point: shm between ranks of one host, tcp across hosts). A push
// is a PushHeader sent before the step's last backward (so the server can post its receives),
// the worker's gradients of the server's key range in chunks of at most kPsChunkElements, each
// sent as soon as backward has finished every parameter in it, and a second PushHeader with the
// step's record once the loss is known; a reply is a PsReply,
// the step records of the workers whose gradients the step applied (sync), and the server's
// parameters of its range after the update. Each pair of ranks talks on its own tags, in order.
#pragma once

#include <array>
#include <cstdint>

namespace meshtrain::parallel {

// The tags of the two directions (messages between two ranks keep their order per tag).
inline constexpr uint32_t kPsPushTag = 0x50530001;
inline constexpr uint32_t kPsReplyTag = 0x50530002;
// Chunk k of a push goes on kPsDataTag + k: chunks leave in the order backward finishes them
// (the last first), and messages of one tag match receives in posting order.
inline constexpr uint32_t kPsDataTag = 0x50540000;

// Gradient elements per chunk of a push: small enough that the first chunks travel while
// backward computes the rest.
inline constexpr int64_t kPsChunkElements = int64_t{1} << 18;

// Floats of a worker's step record (StepRecord::kFloats: loss, compute seconds, stop, save).
inline constexpr int kPsRecordFloats = 4;

struct PushHeader {
  enum Flags : uint32_t {
    kDone = 1,
    // A process replacing a worker that failed (async and ssp), on its new links: the server
    // replies with its parameters and the last step of that worker it applied (PsReply::clock).
    kJoin = 2,
  };
  int64_t step = 0;  // the worker's step, 1-based; the data follows unless kDone
  // The step the worker's model was restored from (0: a fresh start): the servers load their
  // own checkpoint of that step before the first update.
  int64_t resumed = 0;
  std::array<float, kPsRecordFloats> record{};
  float lr = 0.0f;
  uint32_t flags = 0;
  // async and ssp: this gradient's sum of squared elements over every server's range, so that
  // each server clips its range by the whole gradient's norm without asking the others.
  double grad_squares = 0.0;
};

struct PsReply {
  enum Flags : uint32_t {
    kAccepted = 1,  // the step applied this worker's gradient (else: dropped, train it again)
    kSkipped = 2,   // the loss or the norm was not finite: nothing was applied
    // The servers saved this step (every worker reached it): the workers save it too where they
    // are not in lock step (async, ssp, backup workers). A step some worker never reached (it
    // stopped before) is no checkpoint for anyone.
    kSaved = 4,
    kJoined = 8,  // the answer to a PushHeader::kJoin
  };
  int64_t version = 0;        // updates this server applied so far
  double grad_squares = 0.0;  // of the gradient applied: the average (sync) or the worker's
  uint32_t flags = 0;
  int32_t staleness = 0;  // steps the worker ran ahead of the slowest when it was applied
  int32_t records = 0;    // how many step records follow (the accepted workers', in rank order)
  int32_t pad = 0;
  int64_t clock = 0;  // kJoined: the worker's last step this server applied
};

}  // namespace meshtrain::parallel
