// What the training loop needs to know about one kind of model: its data, the unit its
// throughput is counted in, how the run introduces it, and what it prints at the end. The loop,
// its observers, checkpoints and metrics are the same for every kind; a language model
// (language_model_task.h) reads token shards, counts tokens and prints a text sample, a
// classifier (classification_task.h) reads labelled samples, counts samples and prints its
// validation accuracy. make_task (task_factory.h) picks one from model.kind.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "meshtrain/data/prefetch_loader.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/runtime/config.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::runtime {

// The unit of a run's throughput: "tokens" writes tokens_per_s into metrics.jsonl, "tok/s" on
// the progress line and "N tokens per step" in the run's first line.
struct ThroughputUnit {
  std::string name = "samples";    // plural noun: "tokens", "samples"
  std::string rate = "samples/s";  // on the progress line: "tok/s"
  int64_t per_sample = 1;          // units in one sample: a sequence holds block_size tokens
  double flops_per_unit = 0;       // forward and backward model FLOPs, for MFU (0: unknown)
};

// The training order every task's batches follow: data.seed's shuffle, this replica's share.
inline data::SamplerOptions training_order(const TrainConfig& config, int replicas, int replica) {
  data::SamplerOptions so;
  so.seed = static_cast<uint64_t>(config.data.seed);
  so.shuffle = true;
  so.num_replicas = replicas;
  so.rank = replica;
  return so;
}

// How many batches of data.batch_size one evaluation reads from a set of `samples`:
// data.val_batches, fewer when the set is smaller, at least one.
inline int64_t eval_batch_count(const TrainConfig& config, int64_t samples) {
  return std::min<int64_t>(config.data.val_batches,
                           std::max<int64_t>(1, samples / config.data.batch_size));
}

class Task {
 public:
  virtual ~Task() = default;

  // The training batches of data-parallel replica `replica` of `replicas` (the ranks of one
  // pipeline or tensor-parallel group read the same ones), `batch_size` samples each, in the
  // order data.seed shuffles them; the position is what checkpoints save and restore.
  virtual std::unique_ptr<data::BatchSource> train_batches(int replicas, int replica,
                                                           int64_t batch_size) const = 0;
  // The batches one evaluation averages over: the same, in the same order, every time.
  virtual std::vector<std::pair<Tensor, Tensor>> eval_batches() const = 0;

  virtual ThroughputUnit unit() const = 0;
  // The model and data part of the run's first line ("GPT 1234 parameters, 4 layers, width
  // 128; 56789 training tokens").
  virtual std::string describe(int64_t parameters) const = 0;

  // Whether the run ends with a printout made from the whole model (rank 0, after consolidate).
  virtual bool prints_sample() const = 0;
  // The printout: a text sample for a language model, the validation accuracy for a classifier.
  virtual std::string sample(parallel::TrainEngine& engine) const = 0;
  // What the log puts before it ("sample:\n" before a text, nothing before a one-line result).
  virtual std::string sample_heading() const { return {}; }
};

}  // namespace meshtrain::runtime
