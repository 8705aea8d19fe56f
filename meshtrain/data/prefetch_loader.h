// Batches prepared ahead of the training thread. A background thread draws batches from a
// source (a DataLoader, or any BatchSource) into a bounded queue, so that reading windows from
// the token shards and copying them into tensors overlaps the previous training step instead of
// stalling it. The sequence of batches is exactly the source's; the position reported by
// state() counts only the batches the training thread took with next(), not the ones waiting in
// the queue, so a checkpoint taken between steps resumes at the right batch.
//
// Threading: next(), state(), set_state() and the destructor belong to one consumer thread.
// The worker owns the source while it runs. A failure in the worker (an I/O error reading a
// shard) is delivered in order: the batches prepared before it come out first, then next()
// rethrows it, and every later next() rethrows it again.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "meshtrain/data/data_loader.h"
#include "meshtrain/data/sampler.h"
#include "meshtrain/tensor/tensor.h"

namespace meshtrain::data {

// What the prefetcher draws from: a batch stream with a restorable position.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // (input, target) of the next batch.
  virtual std::pair<Tensor, Tensor> next() = 0;
  // The position after the batches returned so far.
  virtual SamplerState state() const = 0;
  virtual void set_state(const SamplerState& state) = 0;
};

// A DataLoader as a BatchSource.
class DataLoaderSource : public BatchSource {
 public:
  explicit DataLoaderSource(DataLoader loader) : loader_(std::move(loader)) {}
  std::pair<Tensor, Tensor> next() override { return loader_.next(); }
  SamplerState state() const override { return loader_.state(); }
  void set_state(const SamplerState& state) override { loader_.set_state(state); }

 private:
  DataLoader loader_;
};

struct PrefetchOptions {
  int64_t depth = 2;  // batches prepared ahead, 1 to 64
};

class PrefetchingLoader {
 public:
  PrefetchingLoader(std::unique_ptr<BatchSource> source, PrefetchOptions options = {});
  PrefetchingLoader(DataLoader loader, PrefetchOptions options = {});
  // Stops the worker (it finishes the batch it is preparing, if any) and joins it.
  ~PrefetchingLoader();
  PrefetchingLoader(const PrefetchingLoader&) = delete;
  PrefetchingLoader& operator=(const PrefetchingLoader&) = delete;

  // The next batch, waiting for the worker if it is not ready yet; rethrows a worker failure.
  std::pair<Tensor, Tensor> next();
  // The position after the batches returned by next().
  SamplerState state() const;
  // Drops the prepared batches, moves the source to `state` and prepares from there.
  void set_state(const SamplerState& state);

  int64_t depth() const { return options_.depth; }
  // Batches prepared and waiting (for tests and the data-wait metric).
  int64_t ready() const;

 private:
  struct Item {
    std::pair<Tensor, Tensor> batch;
    SamplerState after;        // the source's position after this batch
    std::exception_ptr error;  // set on the last item when the worker failed
  };

  void start();
  void stop();
  void run();

  std::unique_ptr<BatchSource> source_;
  PrefetchOptions options_;
  SamplerState consumed_;  // position after the last batch next() returned

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::exception_ptr failed_;  // a failure already returned by next(), returned again
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace meshtrain::data
