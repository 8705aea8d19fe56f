// PrefetchingLoader: one worker thread, a bounded queue, positions carried with the batches.
#include "meshtrain/data/prefetch_loader.h"

#include "meshtrain/util/error.h"

namespace meshtrain::data {

namespace {

std::unique_ptr<BatchSource> non_null(std::unique_ptr<BatchSource> source) {
  MT_CHECK(source != nullptr, "PrefetchingLoader without a source");
  return source;
}

}  // namespace

PrefetchingLoader::PrefetchingLoader(std::unique_ptr<BatchSource> source, PrefetchOptions options)
    : source_(non_null(std::move(source))), options_(options) {
  if (options_.depth < 1 || options_.depth > 64)
    MT_THROW(ValueError, "prefetch depth must be in [1, 64], got ", options_.depth);
  consumed_ = source_->state();
  start();
}

PrefetchingLoader::PrefetchingLoader(DataLoader loader, PrefetchOptions options)
    : PrefetchingLoader(std::make_unique<DataLoaderSource>(std::move(loader)), options) {}

PrefetchingLoader::~PrefetchingLoader() {
  stop();
}

void PrefetchingLoader::start() {
  {
    std::lock_guard lock(mu_);
    stop_ = false;
    failed_ = nullptr;
    queue_.clear();
  }
  worker_ = std::thread([this] { run(); });
}

void PrefetchingLoader::stop() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void PrefetchingLoader::run() {
  for (;;) {
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stop_ || static_cast<int64_t>(queue_.size()) < options_.depth; });
      if (stop_) return;
    }
    // The source is touched only here while the worker runs, so no lock is held while reading.
    Item item;
    try {
      item.batch = source_->next();
      item.after = source_->state();
    } catch (...) {
      item.error = std::current_exception();
    }
    const bool failed = item.error != nullptr;
    {
      std::lock_guard lock(mu_);
      queue_.push_back(std::move(item));
    }
    cv_.notify_all();
    if (failed) return;
  }
}

std::pair<Tensor, Tensor> PrefetchingLoader::next() {
  Item item;
  {
    std::unique_lock lock(mu_);
    if (failed_) std::rethrow_exception(failed_);
    cv_.wait(lock, [&] { return !queue_.empty(); });
    item = std::move(queue_.front());
    queue_.pop_front();
    if (item.error) {
      failed_ = item.error;
      std::rethrow_exception(failed_);
    }
    consumed_ = item.after;
  }
  cv_.notify_all();  // room for the worker
  return std::move(item.batch);
}

SamplerState PrefetchingLoader::state() const {
  std::lock_guard lock(mu_);
  return consumed_;
}

void PrefetchingLoader::set_state(const SamplerState& state) {
  stop();
  // The worker is joined: the source is ours again. It stands ahead of consumed_ by the
  // prepared batches, which are dropped.
  try {
    source_->set_state(state);
  } catch (...) {
    source_->set_state(consumed_);  // a rejected position leaves the loader where it was
    start();
    throw;
  }
  consumed_ = state;
  start();
}

int64_t PrefetchingLoader::ready() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

}  // namespace meshtrain::data
