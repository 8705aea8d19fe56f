#include "meshtrain/parallel/zero/zero_shards.h"

#include <algorithm>

#include "meshtrain/parallel/device_group_check.h"

namespace meshtrain::parallel {

ZeroShards::ZeroShards(nn::NamedTensors params, const Reducer& reducer, comm::ProcessGroupPtr pg,
                       int stage, const OptimizerFactory& make_optimizer, float weight_decay)
    : params_(std::move(params)), pg_(std::move(pg)), stage_(stage) {
  MT_CHECK(stage_ == 1 || stage_ == 2, "ZeroShards handles stages 1 and 2, not ", stage_);
  const int64_t world = pg_->size();
  const int64_t rank = pg_->rank();
  const auto& layout = reducer.bucket_layout();
  const Device device = params_.empty() ? Device::cpu() : params_.front().second.device();
  check_group_reaches(*pg_, device, "ZeRO's parameters");
  std::vector<ShardedOptimizer::Segment> segments;
  for (size_t b = 0; b < layout.size(); ++b) {
    const int64_t n = reducer.bucket_numel(b);
    MT_CHECK(n % world == 0, "bucket ", b, " of ", n, " elements is not padded to ", world);
    const int64_t slice = n / world;
    // Collective, in bucket order on every rank: shared between a host's ranks by the shm
    // backend, whose all-gather then writes into the peers' arenas directly. On a device the
    // arena is device memory, which the device group (nccl) gathers in place.
    Tensor arena;
    if (device.is_cpu()) {
      std::shared_ptr<comm::CommBuffer> mem = pg_->allocate_buffer(static_cast<size_t>(n) * 4);
      void* data = mem->data();
      arena = Tensor::from_blob(data, {n}, DType::f32, Device::cpu(), std::move(mem));
    } else {
      arena = Tensor::zeros({n}, DType::f32, device);
    }
    const int64_t lo = rank * slice, hi = lo + slice;
    for (size_t idx : layout[b]) {
      Tensor& p = params_[idx].second;
      const int64_t off = reducer.offset_in_bucket(idx);
      const int64_t k = p.numel();
      Tensor view = arena.slice(off, off + k);
      view.copy_(p.detach().view({k}));
      p.set_data(view.view(p.shape()));
      const int64_t a = std::max(off, lo), e = std::min(off + k, hi);
      if (a >= e) continue;
      // The gradient a segment reads: the parameter's averaged gradient (stage 1) or this
      // rank's reduce-scattered shard of the bucket (stage 2).
      segments.push_back({idx, a - off, e - off, p.view({k}).slice(a - off, e - off),
                          stage_ == 1 ? reducer.bucket_view(idx).view({k}).slice(a - off, e - off)
                                      : reducer.shard(b).slice(a - lo, e - lo)});
    }
    arenas_.push_back(arena);
    slice_.push_back(slice);
  }
  optimizer_ = std::make_unique<ShardedOptimizer>(params_, std::move(segments), make_optimizer,
                                                  weight_decay);
}

ReducerOptions ZeroShards::reducer_options(ReducerOptions base, int stage, int world) {
  base.pad_to = world;
  base.reduce_scatter = stage >= 2;
  // ZeRO-1 keeps whole averaged gradients (views of the buckets); ZeRO-2 keeps only its shards,
  // the buckets being two buffers that the launches take turns with.
  base.gradient_as_bucket_view = stage == 1;
  base.bucket_pool = stage >= 2 ? 2 : 0;
  return base;
}

void ZeroShards::after_update() {
  const int64_t rank = pg_->rank();
  std::vector<comm::WorkPtr> works;
  for (size_t b = 0; b < arenas_.size(); ++b) {
    float* base = arenas_[b].data<float>();
    // In place: this rank's slice is its input and its block of the output.
    works.push_back(
        pg_->all_gather(base + rank * slice_[b], base, static_cast<size_t>(slice_[b]), DType::f32));
  }
  for (auto& w : works) w->wait();
}

}  // namespace meshtrain::parallel
