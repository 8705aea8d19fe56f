#include "meshtrain/parallel/ddp/reducer.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/parallel/device_group_check.h"
#include "meshtrain/tensor/device_kernels.h"

namespace meshtrain::parallel {
namespace {
constexpr size_t kMinBuckets = 4;
}  // namespace

Reducer::Reducer(nn::NamedTensors params, comm::ProcessGroupPtr pg, ReducerOptions options)
    : params_(std::move(params)),
      device_(params_.empty() ? Device::cpu() : params_.front().second.device()),
      pg_(std::move(pg)),
      options_(std::move(options)),
      hook_(make_comm_hook(options_.comm_hook)),
      inv_world_(1.0f /
                 static_cast<float>(options_.divide_by > 0 ? options_.divide_by : pg_->size())),
      average_correction_(options_.divide_by > 0 ? static_cast<float>(pg_->size()) /
                                                       static_cast<float>(options_.divide_by)
                                                 : 1.0f) {
  MT_CHECK(!params_.empty(), "data parallelism needs at least one parameter");
  for (auto& [name, p] : params_) {
    MT_CHECK(p.requires_grad() && p.is_leaf(), "parameter '", name,
             "' must be a leaf tensor that requires grad");
    MT_CHECK(p.dtype() == DType::f32, "parameter '", name, "' is ", dtype_name(p.dtype()),
             "; the reducer handles f32 parameters");
    MT_CHECK(p.device() == device_, "parameter '", name, "' is on ", p.device().str(), ", '",
             params_.front().first, "' on ", device_.str(),
             "; data parallelism needs every parameter on one device");
  }
  check_group_reaches(*pg_, device_, "the gradients");
  if (!device_.is_cpu()) {
    const std::string hook = hook_->name();
    MT_CHECK(hook == "allreduce" || hook == "bf16" || hook == "f16", "comm hook '", hook,
             "' is not supported on ", device_.str(), " (allreduce, bf16 and f16 are)");
  }
  MT_CHECK(options_.pad_to >= 1, "bucket padding must be at least 1");
  MT_CHECK(!options_.reduce_scatter || hook_->name() == "allreduce",
           "reduce-scattered gradients need the allreduce comm hook, not '", hook_->name(), "'");
  MT_CHECK(options_.bucket_pool >= 0, "the bucket pool cannot be negative");
  MT_CHECK(
      options_.bucket_pool == 0 || (options_.reduce_scatter && !options_.gradient_as_bucket_view),
      "pooled buckets need reduce_scatter without gradient_as_bucket_view");
  std::vector<size_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = order.size() - 1 - i;
  build_buckets(order);
  ready_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i)
    autograd::register_grad_ready_hook(params_[i].second,
                                       [this, i](const Tensor&) { on_grad_ready(i); });
}

Reducer::~Reducer() {
  for (auto& [name, p] : params_) autograd::clear_grad_ready_hooks(p);
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  layout_.clear();
  size_t total = 0;
  for (const auto& [name, p] : params_) total += static_cast<size_t>(p.numel()) * 4;
  // A model whose gradients fit in one or two buckets of the configured size would send almost
  // everything after backward has ended, with nothing left to overlap: cap the buckets so that
  // there are at least kMinBuckets of them (never below the first bucket's size).
  const size_t cap =
      std::min(options_.bucket_bytes, std::max(options_.first_bucket_bytes, total / kMinBuckets));
  size_t bytes = 0;
  for (size_t idx : order) {
    const size_t nbytes = static_cast<size_t>(params_[idx].second.numel()) * 4;
    // The bucket being filled is layout_.back(): the first one is capped small.
    const size_t limit = layout_.size() == 1 ? options_.first_bucket_bytes : cap;
    if (layout_.empty() || (bytes > 0 && bytes + nbytes > limit)) {
      layout_.emplace_back();
      bytes = 0;
    }
    layout_.back().push_back(idx);
    bytes += nbytes;
  }
  slots_.assign(params_.size(), {});
  buckets_.clear();
  auto make_buffer = [this](int64_t n) {
    if (device_.is_cpu() && options_.shared_buckets) {
      // Memory from the group (shared between ranks by the shm backend, whose all-reduce then
      // reads the peers' gradients in place). Allocation is collective, as this function is.
      std::shared_ptr<comm::CommBuffer> mem = pg_->allocate_buffer(static_cast<size_t>(n) * 4);
      void* data = mem->data();
      return Tensor::from_blob(data, {n}, DType::f32, device_, std::move(mem));
    }
    return Tensor::zeros({n}, DType::f32, device_);
  };
  std::vector<int64_t> sizes;
  for (size_t b = 0; b < layout_.size(); ++b) {
    int64_t n = 0;
    GradBucket gb;
    for (size_t idx : layout_[b]) {
      slots_[idx] = {b, n};
      gb.params.push_back({idx, params_[idx].first, n, params_[idx].second.shape()});
      n += params_[idx].second.numel();
    }
    gb.index = static_cast<int>(b);
    n = (n + options_.pad_to - 1) / options_.pad_to * options_.pad_to;
    sizes.push_back(n);
    if (options_.bucket_pool == 0) gb.buffer = make_buffer(n);
    buckets_.push_back(std::move(gb));
  }
  pool_.clear();
  if (options_.bucket_pool > 0) {
    const int64_t largest = *std::max_element(sizes.begin(), sizes.end());
    const size_t k = std::min<size_t>(static_cast<size_t>(options_.bucket_pool), buckets_.size());
    for (size_t i = 0; i < k; ++i) pool_.push_back(make_buffer(largest));
    for (size_t b = 0; b < buckets_.size(); ++b)
      buckets_[b].buffer = pool_[b % k].slice(0, sizes[b]);
  }
  shards_.clear();
  if (options_.reduce_scatter) {
    for (const GradBucket& gb : buckets_)
      shards_.push_back(Tensor::zeros({gb.buffer.numel() / pg_->size()}, DType::f32, device_));
  }
  views_.assign(params_.size(), Tensor());
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i].second;
    const Slot s = slots_[i];
    views_[i] = buckets_[s.bucket].buffer.slice(s.offset, s.offset + p.numel()).view(p.shape());
  }
  stats_.buckets = static_cast<int>(layout_.size());
}

void Reducer::prepare_for_backward() {
  if (!require_sync_) return;
  std::fill(ready_.begin(), ready_.end(), false);
  pending_.assign(layout_.size(), 0);
  for (size_t b = 0; b < layout_.size(); ++b) pending_[b] = static_cast<int>(layout_[b].size());
  works_.assign(layout_.size(), nullptr);
  launched_all_ = false;
  ready_order_.clear();
  next_launch_ = 0;
  stats_.launched_during_backward = 0;
  stats_.wait_s = 0;
  stats_.wire_bytes = 0;
  stats_.divided_in_place = 0;
  in_backward_ = true;
}

void Reducer::fill_slot(size_t index) {
  Tensor& p = params_[index].second;
  float* dst = views_[index].data<float>();
  const int64_t n = p.numel();
  // A hook whose collective averages gets the gradients as they are, unless the divisor is not
  // the group's size (ReducerOptions::divide_by): then they are scaled by what the average misses.
  const bool averaged = hook_->divides_in_collective();
  const float scale = averaged ? average_correction_ : inv_world_;
  const bool divide = scale != 1.0f;
  const Tensor g = p.grad();
  const bool in_bucket = g.defined() && g.data<float>() == dst;
  if (in_bucket && divide) stats_.divided_in_place += static_cast<size_t>(n);
  if (!device_.is_cpu()) {
    // Queued on the current stream; the bucket's collective is ordered after it.
    if (!g.defined()) {
      views_[index].zero_();
    } else if (!in_bucket || divide) {
      MT_CHECK(g.device() == device_, "gradient of '", params_[index].first, "' is on ",
               g.device().str(), ", its bucket on ", device_.str());
      device_kernels(device_, "ddp gradient bucket").scale(device_, dst, g.data<float>(), scale, n);
    }
  } else if (!g.defined()) {
    std::memset(dst, 0, static_cast<size_t>(n) * 4);
  } else if (in_bucket) {
    // Autograd accumulated straight into the bucket: at most the division is left.
    if (divide)
      for (int64_t i = 0; i < n; ++i) dst[i] *= scale;
  } else if (!divide) {
    std::memcpy(dst, g.data<float>(), static_cast<size_t>(n) * 4);
  } else {
    // A fresh gradient (autograd hands over its own buffer when .grad was unset): one pass
    // copies and divides.
    const float* src = g.data<float>();
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * scale;
  }
  if (options_.gradient_as_bucket_view) p.set_grad(views_[index]);
}

void Reducer::on_grad_ready(size_t index) {
  if (!require_sync_ || !in_backward_) return;
  MT_CHECK(!ready_[index], "parameter '", params_[index].first,
           "' received its gradient twice in one synchronised backward pass");
  ready_[index] = true;
  ready_order_.push_back(index);
  // Pooled buckets are filled at launch, when their buffer is free again.
  if (pool_.empty()) fill_slot(index);
  const size_t b = slots_[index].bucket;
  if (--pending_[b] == 0) launch_ready_buckets();
}

void Reducer::launch_ready_buckets() {
  while (next_launch_ < layout_.size() && pending_[next_launch_] == 0) {
    GradBucket& b = buckets_[next_launch_];
    if (!pool_.empty()) {
      // The bucket that used this buffer before was launched earlier, so waiting for it cannot
      // wait on this backward pass.
      const size_t k = pool_.size();
      if (next_launch_ >= k && works_[next_launch_ - k]) works_[next_launch_ - k]->wait();
      for (size_t idx : layout_[next_launch_]) {
        fill_slot(idx);
        params_[idx].second.set_grad(Tensor());  // only this rank's shard is kept
      }
    }
    if (options_.reduce_scatter) {
      // Averaged as the all-reduce hook averages, so that every element gets the all-reduce's
      // bits (the shm backend reduces both in rank order).
      Tensor& out = shards_[next_launch_];
      works_[next_launch_] =
          pg_->reduce_scatter(b.buffer.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                              DType::f32, {.op = comm::ReduceOp::avg});
    } else {
      works_[next_launch_] = hook_->launch(b, *pg_);
    }
    stats_.wire_bytes += hook_->wire_bytes(b);
    if (in_backward_) ++stats_.launched_during_backward;
    ++next_launch_;
  }
}

void Reducer::launch_remaining() {
  if (!require_sync_ || !in_backward_) return;
  // The hooks of this backward pass have all run; what is left got no gradient.
  std::vector<std::string> missing;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (ready_[i]) continue;
    if (!options_.find_unused_parameters) {
      missing.push_back(params_[i].first);
      continue;
    }
    // No gradient in this pass; what earlier no_sync passes accumulated still counts.
    if (pool_.empty()) fill_slot(i);
    ready_[i] = true;
    ready_order_.push_back(i);
    --pending_[slots_[i].bucket];
  }
  in_backward_ = false;
  if (!missing.empty()) {
    std::ostringstream os;
    for (size_t k = 0; k < missing.size() && k < 5; ++k) os << (k ? ", " : "") << missing[k];
    if (missing.size() > 5) os << " and " << missing.size() - 5 << " more";
    MT_THROW(Error, "rank ", pg_->rank(),
             ": parameters received no gradient in this backward pass (", os.str(),
             "); enable find_unused_parameters if the model uses a different subset "
             "of parameters each step");
  }
  launch_ready_buckets();
  launched_all_ = true;
}

void Reducer::finalize_backward() {
  if (!require_sync_) return;
  MT_CHECK(in_backward_ || launched_all_, "finalize_backward without prepare_for_backward");
  launch_remaining();
  launched_all_ = false;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t b = 0; b < works_.size(); ++b) {
    works_[b]->wait();
    if (!options_.reduce_scatter) hook_->finish(buckets_[b]);
  }
  stats_.wait_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // With bucket views the gradients already are the averaged buckets; reduce-scattered ones
  // live in the shards.
  if (!options_.gradient_as_bucket_view && !options_.reduce_scatter) {
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = params_[i].second;
      if (!p.grad().defined()) p.set_grad(Tensor::empty(p.shape(), DType::f32, device_));
      Tensor g = p.grad();
      g.copy_(views_[i]);
    }
  }
  if (first_iteration_) {
    first_iteration_ = false;
    // Padded (ZeRO) buckets keep their layout: the shards of parameters and optimizer state
    // are cut from it.
    if (options_.rebuild_buckets && options_.pad_to == 1) rebuild_from_ready_order();
  }
}

void Reducer::reduce_held_gradients() {
  const bool sync = require_sync_;
  require_sync_ = true;
  prepare_for_backward();
  // Every gradient is ready at once, in registration order; the buckets launch in their order.
  for (size_t i = 0; i < params_.size(); ++i) {
    ready_[i] = true;
    ready_order_.push_back(i);
    if (pool_.empty()) fill_slot(i);
    --pending_[slots_[i].bucket];
  }
  in_backward_ = false;
  launch_ready_buckets();
  launched_all_ = true;
  try {
    finalize_backward();
  } catch (...) {
    require_sync_ = sync;
    throw;
  }
  require_sync_ = sync;
}

void Reducer::rebuild_from_ready_order() {
  // Every rank adopts rank 0's arrival order so that bucket launches stay matched.
  std::vector<int64_t> order(params_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(ready_order_[i]);
  if (device_.is_cpu()) {
    pg_->broadcast(order.data(), order.size(), DType::i64)->wait();
  } else {
    // The group reads device memory: the order travels through a device tensor.
    Tensor host = Tensor::empty({static_cast<int64_t>(order.size())}, DType::i64);
    std::memcpy(host.data_ptr(), order.data(), order.size() * sizeof(int64_t));
    Tensor dev = host.to(device_);
    pg_->broadcast(dev.data_ptr(), order.size(), DType::i64)->wait();
    host = dev.to(Device::cpu());
    std::memcpy(order.data(), host.data_ptr(), order.size() * sizeof(int64_t));
  }
  std::vector<size_t> o(order.begin(), order.end());
  std::vector<bool> seen(params_.size(), false);
  for (size_t idx : o) {
    MT_CHECK(idx < params_.size() && !seen[idx], "corrupt bucket order from rank 0");
    seen[idx] = true;
  }
  build_buckets(o);
  rebuilt_ = true;
  // The gradients move into the new buckets once, so that they stay views from now on.
  if (options_.gradient_as_bucket_view) {
    for (size_t i = 0; i < params_.size(); ++i) {
      Tensor& p = params_[i].second;
      Tensor v = views_[i];
      v.copy_(p.grad());
      p.set_grad(v);
    }
  }
}

}  // namespace meshtrain::parallel
