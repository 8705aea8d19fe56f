// PsClient: a worker's side of a parameter-server job, as the engine's parts. As the GradSync
// it keeps the gradients in one flat buffer (the parameters' gradients are views of it, so
// backward accumulates straight into what is pushed) and, at the end of the step, pushes each
// server its key range with the step's record, then waits for the replies: the servers' updated
// parameters and, in sync, the records of the workers whose gradients the step applied, from
// which the mean loss is the all-reduce job's bits. The record travels with the gradients, so
// the workers never wait for each other. As the Update it reports the gradient norm the servers
// used and takes their parameters at step(): the optimizer ran on the servers. As the ParamSync
// it says whether the replicas are the same at rest (sync without backup workers). A worker's
// model may be on a device: its gradient chunks are copied to the host as they are pushed and
// the servers' parameters copied back.
#pragma once

#include <cstdint>
#include <vector>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/nn/module.h"
#include "meshtrain/parallel/param_server/parameter_server.h"
#include "meshtrain/parallel/param_server/ps_layout.h"
#include "meshtrain/parallel/param_server/ps_links.h"
#include "meshtrain/parallel/parts/grad_sync.h"
#include "meshtrain/parallel/parts/param_sync.h"
#include "meshtrain/parallel/parts/update.h"

namespace meshtrain::parallel {

struct PsClientOptions {
  PsConsistency consistency = PsConsistency::sync;
  int backup_workers = 0;
  int staleness = 3;
};

class PsClient final : public GradSync, public ParamSync, public Update {
 public:
  // `servers`: the channel to each server (ps_links.h).
  PsClient(nn::NamedTensors params, PsLayout layout, int worker, std::vector<PsPeer> servers,
           PsClientOptions options);
  // Tells every server this worker is done (errors are dropped: a failed job ends anyway).
  ~PsClient() override;

  // GradSync
  void zero_grad(const nn::NamedTensors& params) override;
  void before_backward(bool last) override;
  void after_backward(bool last) override;
  bool carries_records() const override { return true; }
  float finish_with_record(const StepRecord& mine, StepOutcome& out) override;
  size_t in_flight_bytes() const override;
  bool lockstep() const override { return whole_at_rest(); }
  std::string describe() const override;

  // ParamSync
  bool whole_at_rest() const override;
  // A replacement for a worker that failed (async and ssp): takes every server's parameters and
  // continues after the last step of its predecessor that every server applied.
  std::optional<int64_t> join_running_job() override;

  // Update
  void set_lr(float lr) override { lr_ = lr; }
  bool unscale(const optim::LossScaler& scaler) override;
  GradSquares grad_squares(const NormShare& share) const override;
  // The servers clip (with the norm of the whole gradient) and step; grad_scale is theirs.
  void step(float grad_scale) override;
  bool sharded() const override { return false; }
  nlohmann::json add_to_checkpoint(ckpt::RankShards& shards,
                                   const StatePlace& place) const override;
  void restore(const ckpt::Checkpoint& checkpoint, const nlohmann::json& scalars,
               const StatePlace& place) override;

 private:
  nn::NamedTensors params_;
  PsLayout layout_;
  int worker_;
  std::vector<PsPeer> servers_;
  PsClientOptions options_;
  // Flat, every parameter's gradient in the model's order: where the parameters are (their
  // gradients are views of it), and its host copy the pushes send from when that is a device.
  Tensor grad_;
  Tensor host_grad_;
  Device device_ = Device::cpu();
  std::vector<float> pulled_;  // flat, the servers' parameters from the last replies
  float lr_ = 0.0f;
  int64_t step_ = 0;     // the last step pushed (or resumed)
  int64_t resumed_ = 0;  // the checkpoint's step this worker resumed from
  double grad_squares_ = 0.0;
  bool pulled_fresh_ = false;

  // A push chunk: [begin, end) of the flat gradients, to server `server`.
  struct Chunk {
    int server = 0;
    int64_t begin = 0;
    int64_t end = 0;
    int params = 0;   // parameters overlapping it
    int pending = 0;  // of them, still without their final gradient in this backward
    bool sent = false;
  };
  void on_grad_ready(size_t param);
  void send_chunk(Chunk& chunk);
  std::vector<Chunk> chunks_;
  std::vector<std::vector<size_t>> chunks_of_;  // per parameter, the chunks it overlaps
  bool armed_ = false;                          // the step's last backward is running
  comm::WorkPtr send_to(int server, const void* data, size_t count, DType dtype, uint32_t tag);
  // Sends `h` to every server and waits for `works`, the replies (header, records, and the
  // server's parameters into pulled_).
  void exchange(const PushHeader& h, std::vector<comm::WorkPtr>& works,
                std::vector<PsReply>& replies, std::vector<std::vector<float>>& records);
  comm::WorkPtr recv_from(int server, void* data, size_t count, DType dtype, uint32_t tag);
  std::vector<comm::WorkPtr> pushes_;
  std::vector<PushHeader> begin_;  // per server, the step's first message until it is sent
};

}  // namespace meshtrain::parallel
