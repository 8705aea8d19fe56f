// ParameterServer: the loop a server rank runs instead of training. It holds the parameters of
// its key range (ps_layout.h) and their optimizer state, takes the workers' pushed gradients,
// applies them and replies with its updated parameters:
//   - sync: a step waits for every worker's gradient (or the first workers - b with backup
//     workers; a late one is answered "dropped" so its worker trains that batch again), sums them
//     in rank order and divides by their count, as the all-reduce averages; the servers exchange
//     each parameter's sum of squares so they share one gradient norm, clip, skip a non-finite
//     step, and apply one optimizer step. With every worker accepted this is the all-reduce job's
//     update, bit for bit.
//   - async: each gradient is applied as it arrives, clipped by the norm its worker computed;
//     ssp: the same, but a worker's reply is held until the slowest worker is at most `staleness`
//     steps behind it. Staleness is how many steps a gradient's worker ran ahead of the slowest
//     worker's finished steps when it was applied (0 in sync); staleness_lr divides its learning
//     rate by 1 + staleness.
// Every worker ends with a "done" push; the loop returns when all have. In async and ssp mode a
// worker whose link fails is gone, not an error: the others go on (async freely; ssp within its
// bound of the gone worker's last step; a checkpoint's cut waits for it), and the process that
// replaces it joins on a new link (ps_links.h) with the parameters as they are and its
// predecessor's clock.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/optim/optimizer.h"
#include "meshtrain/parallel/param_server/ps_layout.h"
#include "meshtrain/parallel/param_server/ps_links.h"
#include "meshtrain/parallel/param_server/ps_messages.h"
#include "meshtrain/parallel/zero/sharded_optimizer.h"

namespace meshtrain::parallel {

enum class PsConsistency { sync, async, ssp };

struct ParameterServerOptions {
  PsConsistency consistency = PsConsistency::sync;
  int staleness = 3;       // ssp
  int backup_workers = 0;  // sync
  bool staleness_lr = false;
  double grad_clip = 0.0;  // max gradient norm (0: off)
  float weight_decay = 0.0f;
  // After step t the server writes its parameters and optimizer state to
  // <checkpoint_dir>/step_<t>.safetensors when the workers checkpoint that step too, keeping the
  // newest keep_last (0: all) and every keep_every-th. Empty: no checkpoints. Sync: every
  // checkpoint_interval steps, the last step, a stop or rank 0's save request. Async and ssp:
  // every checkpoint_interval steps and the last step, each a cut (no worker's reply of that
  // step leaves before every worker's gradient of it was applied, and none of a later step is).
  std::string checkpoint_dir;
  int64_t checkpoint_interval = 0;
  int64_t last_step = 0;
  int64_t keep_last = 0;
  int64_t keep_every = 0;
  // async and ssp: the link to the process replacing `worker`, of `generation` (waits for it);
  // empty: a failed link fails the server.
  std::function<PsPeer(int worker, int64_t generation)> relink;
};

// What a server did, for its log line and the tests.
struct ParameterServerReport {
  int64_t applied = 0;  // gradients applied (sync: per worker of each step)
  int64_t steps = 0;    // optimizer steps
  int64_t dropped = 0;  // late gradients answered "dropped" (their batches are trained again)
  int64_t skipped = 0;  // steps not applied: a non-finite loss or norm
  int64_t lost = 0;     // worker links that failed, each then waited for its replacement
  std::vector<int64_t> staleness_histogram;  // [k]: gradients applied with staleness k
  int max_staleness = 0;
  std::vector<int64_t> worker_clock;  // per worker: its last step the server applied
  uint64_t push_bytes = 0;
  uint64_t pull_bytes = 0;
  double busy_s = 0.0;  // applying and replying
  double wall_s = 0.0;
  nlohmann::json to_json() const;
};

class ParameterServer {
 public:
  // `params`: the whole model's parameters in the model's order (their initial values: the
  // server keeps its range's, the rest may be dropped). `workers`: the channel to each worker;
  // `servers`: the servers' own group (null with one server).
  ParameterServer(const nn::NamedTensors& params, PsLayout layout, int server,
                  std::vector<PsPeer> workers, comm::ProcessGroupPtr servers,
                  const OptimizerFactory& make_optimizer, ParameterServerOptions options);
  ~ParameterServer();
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // Serves until every worker said it is done.
  ParameterServerReport serve();
  // This server's parameters (its key range), for the tests.
  const nn::NamedTensors& parameters() const { return own_; }

 private:
  struct Slot {
    std::vector<float> data;
    PushHeader header;
    bool arrived = false;
    bool done = false;
    uint64_t arrival = 0;
    std::vector<float> reply;  // the parameters sent back; free again once `sent` completes
    std::vector<float> records;
    PsReply reply_header;
    std::vector<comm::WorkPtr> sent;
    PsPeer peer;  // the link to the worker
    int64_t generation = 0;
    bool gone = false;  // its link failed; its replacement has not joined yet
  };

  void receive(int worker);
  // Takes worker's pushes from `peer` until its "done" (returns) or a failure (throws).
  void receive_from(int worker, const PsPeer& peer);
  void serve_sync();
  void serve_async();
  // Replies to `worker` with this server's parameters (waits for its previous reply first).
  void reply(int worker, PsReply header, const std::vector<float>& records);
  // Sets the aggregated gradient, applies one step when finite; returns the sum of squares.
  void apply(const std::vector<float>& loss_records, int count, float lr, double grad_squares,
             bool* skipped);
  std::vector<double> param_squares() const;
  // Waits for the first push; a resumed run's servers load their checkpoint of the step the
  // workers resumed from. Returns the first step to serve.
  int64_t first_step();
  // The workers checkpoint this step whatever happens (an interval step or the last one).
  bool saves_at(int64_t step) const;
  void save(int64_t step);
  void load(int64_t step);
  void rethrow_locked();

  PsLayout layout_;
  int server_;
  comm::ProcessGroupPtr servers_;
  ParameterServerOptions options_;
  nn::NamedTensors own_;
  std::unique_ptr<optim::Optimizer> optimizer_;
  Tensor grad_;  // flat, the range's aggregated gradient; own_'s gradients are views of it
  int64_t n_ = 0;
  int64_t version_ = 0;
  ParameterServerReport report_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Slot> slots_;
  uint64_t arrivals_ = 0;
  std::exception_ptr error_;
  std::vector<std::thread> receivers_;
};

}  // namespace meshtrain::parallel
