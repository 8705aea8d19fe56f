// PowerSGD (Vogels et al., 2019) with error feedback. Each parameter of two or more dimensions is
// a matrix M (n = first dimension, m = the rest) compressed to rank r by one step of power
// iteration per training step:
//   M += residual;  P = M Q;  all-reduce P;  orthonormalise P (Gram-Schmidt);
//   Q = M^T P;  residual = M - P Q^T (this rank's part that P cannot carry);  all-reduce Q;
//   M_avg ~ P Q^T.
// Q starts from a seed shared by every rank and is warm-started from the previous step's Q.
// One-dimensional parameters (biases, norms) and matrices that the factors would not make
// smaller (r * (n + m) >= n * m) are all-reduced uncompressed in the same collective as P, as
// PyTorch's PowerSGD does.
//
// Bytes per rank and bucket: 4 * (r * (n + m)) per compressed matrix plus 4 * numel for the
// uncompressed parameters, against 4 * n * m for the f32 all-reduce. Convergence: the update
// is biased towards the top singular directions; error feedback carries the rest into later
// steps. Measured by bench/comm_hook_bench (GPT of 106k parameters, 2 ranks, 300 AdamW steps):
// rank 1 sends 3.8% of the f32 bytes and ends 0.27 nats above the uncompressed eval loss, rank 4
// sends 10% and ends 0.12 above; 50 warm-up steps help rank 1 (0.13 above) more than rank 4.
//
// Name: "powersgd:R" or "powersgd:R:W" with W uncompressed warm-up steps (default 0).
//
// Overlap: P's all-reduce is launched from the gradient-ready hooks like a plain bucket, but the
// second phase (Q) needs the reduced P, so it runs in finish, on the training thread, after
// backward: PowerSGD overlaps only its first phase. The phase-two collectives are issued in
// bucket order on every rank, so they match.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "meshtrain/parallel/ddp/comm_hook.h"

namespace meshtrain::parallel {

struct PowerSGDOptions {
  int rank = 2;
  uint64_t seed = 0x9e3779b97f4a7c15ull;  // initial Q; must be the same on every rank
  // Compresses every matrix, even where the factors are not smaller than the matrix (tests use
  // it to check the algebra; the default sends such matrices uncompressed).
  bool compress_all = false;
  // Steps all-reduced uncompressed before compression starts (PyTorch's start_powerSGD_iter):
  // the first steps move the weights the most, and compressing them costs the most loss.
  int64_t warmup_steps = 0;
};

class PowerSGDHook : public CommHook {
 public:
  explicit PowerSGDHook(PowerSGDOptions options = {});
  std::string name() const override;
  comm::WorkPtr launch(GradBucket& bucket, comm::ProcessGroup& pg) override;
  void finish(GradBucket& bucket) override;
  size_t wire_bytes(const GradBucket& bucket) const override;
  // "q.<parameter>" (m x r) and "residual.<parameter>" (the parameter's shape) per compressed
  // matrix, and "steps" (one i64: steps done, for the warm-up).
  nn::NamedTensors state_dict() const override;
  void load_state_dict(const nn::NamedTensors& state) override;

 private:
  // How one parameter of a bucket travels.
  struct Entry {
    BucketParam param;
    bool compressed = false;
    int64_t n = 0, m = 0, r = 0;  // matrix rows, columns and rank used
    size_t p_offset = 0;          // in phase1 (P) or, uncompressed, the values
    size_t q_offset = 0;          // in phase2 (Q)
  };
  struct Plan {
    std::vector<Entry> entries;
    size_t phase1_size = 0, phase2_size = 0;
    std::vector<float> phase1;  // uncompressed values and P factors
    std::vector<float> phase2;  // Q factors
    int64_t launches = 0;       // steps this bucket index has been through
    bool dense = false;         // this launch is a warm-up step: plain all-reduce
  };
  struct MatrixState {
    Tensor q;         // m x r, warm start
    Tensor residual;  // n x m
  };

  Plan make_plan(const GradBucket& bucket) const;
  MatrixState& state_for(const Entry& e);

  PowerSGDOptions options_;
  std::map<std::string, MatrixState> state_;  // by parameter name
  std::vector<Plan> plans_;                   // by bucket index
  comm::ProcessGroup* pg_ = nullptr;          // the group of the last launch, for phase two
  int64_t steps_loaded_ = 0;                  // steps done before a load_state_dict
};

}  // namespace meshtrain::parallel
