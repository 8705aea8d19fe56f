#include "meshtrain/parallel/zero/fsdp_units.h"

#include <malloc.h>

#include <algorithm>
#include <sstream>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/function.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/parallel/device_group_check.h"

namespace meshtrain::parallel {

struct FsdpUnits::Unit {
  std::vector<size_t> params;        // indices into params_
  std::vector<int64_t> offsets;      // per parameter: first element in the unit's flat layout
  int64_t numel = 0;                 // padded to a multiple of the group size
  int64_t slice = 0;                 // numel / world: this rank's share
  std::shared_ptr<Storage> storage;  // the unit's parameters; memory only while gathered
  Tensor shard;                      // [slice]: this rank's parameter values at rest
  Tensor grad_shard;                 // [slice]: this rank's averaged gradients after backward
  int slot = -1;                     // param slot while gathered
  comm::WorkPtr gather_work;
  int pending = 0;  // parameters whose gradient is not final yet in this backward
};

// Identity on a block's output: its backward runs when backward reaches the block, before any
// of the block's own nodes, and gathers the block's parameters (prefetching the block before).
class FsdpUnits::GatherForBackward final : public autograd::Function {
 public:
  GatherForBackward(FsdpUnits* owner, size_t unit) : owner_(owner), unit_(unit) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return {in[0].detach()}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    owner_->pre_backward(unit_);
    return {grads[0]};
  }
  std::string name() const override { return "FsdpGatherForBackward"; }

 private:
  FsdpUnits* owner_;
  size_t unit_;
};

FsdpUnits::FsdpUnits(TrainModel& model, comm::ProcessGroupPtr pg, bool unit_per_layer,
                     const OptimizerFactory& make_optimizer, float weight_decay)
    : model_(model), pg_(std::move(pg)), params_(model.module().named_parameters()) {
  const int64_t world = pg_->size(), rank = pg_->rank();
  device_ = params_.empty() ? Device::cpu() : params_.front().second.device();
  check_group_reaches(*pg_, device_, "ZeRO-3's parameters");
  // Which unit each parameter belongs to: its block's, or unit 0.
  std::map<std::string, size_t> index;
  for (size_t i = 0; i < params_.size(); ++i) index[params_[i].first] = i;
  const size_t blocks = unit_per_layer ? model.num_layers() : 0;
  units_.resize(blocks + 1);
  for (auto& u : units_) u = std::make_unique<Unit>();
  std::vector<bool> in_block(params_.size(), false);
  for (size_t b = 0; b < blocks; ++b) {
    for (const auto& [name, p] : model.layer_parameters(b)) {
      units_[b + 1]->params.push_back(index.at(name));
      in_block[index.at(name)] = true;
    }
  }
  for (size_t i = 0; i < params_.size(); ++i)
    if (!in_block[i]) units_[0]->params.push_back(i);

  int64_t max_block = 0, max_unit = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = *units_[u];
    int64_t n = 0;
    for (size_t i : unit.params) {
      unit.offsets.push_back(n);
      n += params_[i].second.numel();
    }
    unit.numel = (n + world - 1) / world * world;
    unit.slice = unit.numel / world;
    if (u > 0) max_block = std::max(max_block, unit.numel);
    max_unit = std::max(max_unit, unit.numel);
  }
  // Shared buffers (collective, the same order everywhere): the shm backend all-gathers and
  // reduce-scatters in them in place. On a device: device memory, for the device group.
  auto shared = [this](int64_t n) {
    if (!device_.is_cpu()) return Tensor::zeros({std::max<int64_t>(n, 1)}, DType::f32, device_);
    std::shared_ptr<comm::CommBuffer> mem =
        pg_->allocate_buffer(static_cast<size_t>(std::max<int64_t>(n, 1)) * 4);
    void* data = mem->data();
    return Tensor::from_blob(data, {std::max<int64_t>(n, 1)}, DType::f32, Device::cpu(),
                             std::move(mem));
  };
  param_slots_.push_back(shared(units_[0]->numel));
  if (blocks > 0) {
    param_slots_.push_back(shared(max_block));
    param_slots_.push_back(shared(max_block));
  }
  slot_owner_.assign(param_slots_.size(), -1);
  grad_slots_.push_back(shared(max_unit));
  grad_slots_.push_back(shared(max_unit));
  grad_work_.resize(grad_slots_.size());

  // Each unit's shard is cut straight from the parameters this rank built, and the parameters
  // become views of one borrowed Storage (first pointed at the unit's gather buffer, then at
  // nothing), so no whole copy of a unit is ever made: building the shards costs no memory
  // beyond the shards themselves, and the whole model goes as its parameters are re-pointed.
  std::vector<ShardedOptimizer::Segment> segments;
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = *units_[u];
    unit.shard = Tensor::zeros({unit.slice}, DType::f32, device_);
    unit.grad_shard = Tensor::zeros({unit.slice}, DType::f32, device_);
    const Tensor& slot = param_slots_[u == 0 ? 0 : 1 + u % 2];
    Tensor whole =
        Tensor::from_blob(slot.data_ptr(), {unit.numel}, DType::f32, device_, slot.storage());
    unit.storage = whole.storage();
    const int64_t lo = rank * unit.slice, hi = lo + unit.slice;
    for (size_t k = 0; k < unit.params.size(); ++k) {
      Tensor& p = params_[unit.params[k]].second;
      const int64_t off = unit.offsets[k], cnt = p.numel();
      const int64_t a = std::max(off, lo), e = std::min(off + cnt, hi);
      if (a < e) {
        Tensor piece = unit.shard.slice(a - lo, e - lo);
        piece.copy_(p.detach().view({cnt}).slice(a - off, e - off));
      }
      p.set_data(whole.slice(off, off + cnt).view(p.shape()));
      if (a >= e) continue;
      segments.push_back({unit.params[k], a - off, e - off, unit.shard.slice(a - lo, e - lo),
                          unit.grad_shard.slice(a - lo, e - lo)});
    }
    unit.storage->rebind(nullptr, nullptr);
  }
  optimizer_ = std::make_unique<ShardedOptimizer>(params_, std::move(segments), make_optimizer,
                                                  weight_decay);
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t i : units_[u]->params)
      autograd::register_grad_ready_hook(params_[i].second,
                                         [this, u](const Tensor&) { on_grad_ready(u); });
  // The whole model this rank built is gone now; hand its pages back to the system instead of
  // leaving them to the allocator's free lists, where they would stay charged to this process.
  ::malloc_trim(0);
  if (blocks > 0) {
    LayerHooks hooks;
    hooks.before = [this](size_t b) { before_block(b); };
    hooks.after = [this](size_t b, const Tensor& x) { return after_block(b, x); };
    model_.set_layer_hooks(std::move(hooks));
  }
}

FsdpUnits::~FsdpUnits() {
  if (!consolidated_) model_.set_layer_hooks({});
  for (auto& [name, p] : params_) autograd::clear_grad_ready_hooks(p);
}

void FsdpUnits::gather_unit(size_t u) {
  Unit& unit = *units_[u];
  if (unit.slot >= 0) return;
  const int slot = u == 0 ? 0 : 1 + static_cast<int>(u % 2);
  // The slot's last unit must be gone: the schedule frees a block before the one two later
  // needs its buffer. Anything else would overwrite parameters still in use.
  MT_CHECK(slot_owner_[static_cast<size_t>(slot)] < 0, "FSDP: unit ", u,
           " needs the buffer that unit ", slot_owner_[static_cast<size_t>(slot)], " still holds");
  Tensor& buf = param_slots_[static_cast<size_t>(slot)];
  float* base = buf.data<float>();
  const int64_t rank = pg_->rank();
  // On a device the copy is queued on the current stream, which the collective follows.
  Tensor mine = buf.slice(rank * unit.slice, (rank + 1) * unit.slice);
  mine.copy_(unit.shard);
  unit.storage->rebind(base, buf.storage());
  unit.slot = slot;
  slot_owner_[static_cast<size_t>(slot)] = static_cast<int>(u);
  unit.gather_work =
      pg_->all_gather(base + rank * unit.slice, base, static_cast<size_t>(unit.slice), DType::f32);
}

void FsdpUnits::wait(size_t u) {
  Unit& unit = *units_[u];
  MT_CHECK(unit.slot >= 0, "FSDP: unit ", u, " is used but was not gathered");
  if (unit.gather_work) {
    unit.gather_work->wait();
    unit.gather_work.reset();
  }
}

void FsdpUnits::release_unit(size_t u) {
  Unit& unit = *units_[u];
  if (unit.slot < 0) return;
  if (unit.gather_work) wait(u);  // the all-gather still writes into the buffer
  unit.storage->rebind(nullptr, nullptr);
  slot_owner_[static_cast<size_t>(unit.slot)] = -1;
  unit.slot = -1;
}

void FsdpUnits::begin_forward() {
  MT_CHECK(!consolidated_, "FSDP: the model was consolidated");
  gather_unit(0);
  if (units_.size() > 1) gather_unit(1);  // the first block's all-gather overlaps nothing but waits
  wait(0);
}

void FsdpUnits::end_forward_and_backward() {
  for (size_t u = 0; u < units_.size(); ++u) release_unit(u);
}

void FsdpUnits::before_block(size_t block) {
  const size_t u = block + 1;
  gather_unit(u);
  wait(u);
  // Issued now, so that it runs while this block computes.
  if (u + 1 < units_.size()) gather_unit(u + 1);
}

Tensor FsdpUnits::after_block(size_t block, const Tensor& x) {
  const size_t u = block + 1;
  release_unit(u);
  if (!autograd::grad_enabled() || !x.requires_grad()) return x;
  return autograd::Function::apply(std::make_shared<GatherForBackward>(this, u), {x})[0];
}

void FsdpUnits::pre_backward(size_t u) {
  gather_unit(u);
  wait(u);
  // Prefetch the block before it, once its buffer is free (the block after this one has
  // normally finished its backward and been freed by now).
  if (u > 1) {
    const int slot = 1 + static_cast<int>((u - 1) % 2);
    if (slot_owner_[static_cast<size_t>(slot)] < 0) gather_unit(u - 1);
  }
}

void FsdpUnits::prepare_for_backward() {
  for (auto& unit : units_) unit->pending = static_cast<int>(unit->params.size());
  in_backward_ = true;
}

void FsdpUnits::on_grad_ready(size_t u) {
  if (!in_backward_) return;
  Unit& unit = *units_[u];
  if (--unit.pending > 0) return;
  if (require_sync_) reduce(u);
  // Every node that reads the unit's parameters has run: they can go.
  if (u > 0) release_unit(u);
}

void FsdpUnits::reduce(size_t u) {
  Unit& unit = *units_[u];
  const size_t k = next_grad_slot_;
  next_grad_slot_ = (next_grad_slot_ + 1) % grad_slots_.size();
  if (grad_work_[k]) {
    grad_work_[k]->wait();
    grad_work_[k].reset();
  }
  Tensor& slot = grad_slots_[k];
  float* base = slot.data<float>();
  // The gradients as they are: the reduce-scatter averages (as DDP's all-reduce hook does).
  for (size_t j = 0; j < unit.params.size(); ++j) {
    Tensor& p = params_[unit.params[j]].second;
    const int64_t n = p.numel();
    const Tensor g = p.grad();
    Tensor dst = slot.slice(unit.offsets[j], unit.offsets[j] + n);
    if (g.defined())
      dst.copy_(g.view({n}));
    else
      dst.zero_();
    p.set_grad(Tensor());  // the whole gradient is not kept: only this rank's shard is
  }
  const int64_t used =
      unit.params.empty() ? 0 : unit.offsets.back() + params_[unit.params.back()].second.numel();
  if (used < unit.numel) {
    Tensor pad = slot.slice(used, unit.numel);
    pad.zero_();
  }
  grad_work_[k] =
      pg_->reduce_scatter(base, unit.grad_shard.data_ptr(), static_cast<size_t>(unit.slice),
                          DType::f32, {.op = comm::ReduceOp::avg});
}

void FsdpUnits::finalize_backward() {
  in_backward_ = false;
  std::vector<std::string> missing;
  for (size_t u = 0; u < units_.size(); ++u) {
    const Unit& unit = *units_[u];
    if (unit.pending == 0) continue;
    for (size_t i : unit.params)
      if (!params_[i].second.grad().defined() || require_sync_) missing.push_back(params_[i].first);
    if (missing.empty()) missing.push_back("unit " + std::to_string(u));
  }
  for (auto& w : grad_work_) {
    if (w) {
      w->wait();
      w.reset();
    }
  }
  if (!missing.empty()) {
    std::ostringstream os;
    for (size_t k = 0; k < missing.size() && k < 5; ++k) os << (k ? ", " : "") << missing[k];
    MT_THROW(Error, "rank ", pg_->rank(), ": FSDP units did not receive every gradient (", os.str(),
             "); ZeRO-3 needs every parameter to take part in every step");
  }
}

size_t FsdpUnits::buffer_bytes() const {
  size_t n = 0;
  for (const Tensor& t : param_slots_) n += t.nbytes();
  for (const Tensor& t : grad_slots_) n += t.nbytes();
  return n;
}

int FsdpUnits::gathered_units() const {
  int n = 0;
  for (const auto& unit : units_) n += unit->slot >= 0 ? 1 : 0;
  return n;
}

nn::NamedTensors FsdpUnits::gather_parameters() const {
  nn::NamedTensors out(params_.size());
  for (const auto& unit : units_) {
    Tensor whole = Tensor::empty({unit->numel}, DType::f32, device_);
    pg_->all_gather(unit->shard.data_ptr(), whole.data_ptr(), static_cast<size_t>(unit->slice),
                    DType::f32)
        ->wait();
    for (size_t k = 0; k < unit->params.size(); ++k) {
      const auto& [name, p] = params_[unit->params[k]];
      out[unit->params[k]] = {
          name,
          whole.slice(unit->offsets[k], unit->offsets[k] + p.numel()).clone().view(p.shape())};
    }
  }
  return out;
}

void FsdpUnits::consolidate(int root) {
  if (consolidated_) return;
  for (size_t u = 0; u < units_.size(); ++u) release_unit(u);
  model_.set_layer_hooks({});
  const bool keep = root < 0 || root == pg_->rank();
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = *units_[u];
    Tensor whole = keep ? Tensor::empty({unit.numel}, DType::f32, device_) : Tensor();
    if (root < 0) {
      pg_->all_gather(unit.shard.data_ptr(), whole.data_ptr(), static_cast<size_t>(unit.slice),
                      DType::f32)
          ->wait();
    } else {
      pg_->gather(unit.shard.data_ptr(), keep ? whole.data_ptr() : nullptr,
                  static_cast<size_t>(unit.slice), DType::f32, {.root = root})
          ->wait();
    }
    if (!keep) continue;
    for (size_t k = 0; k < unit.params.size(); ++k) {
      Tensor& p = params_[unit.params[k]].second;
      p.set_data(whole.slice(unit.offsets[k], unit.offsets[k] + p.numel()).clone().view(p.shape()));
    }
  }
  consolidated_ = true;
}

void FsdpUnits::before_backward(bool last) {
  set_require_sync(last);
  prepare_for_backward();
}

void FsdpUnits::after_backward(bool last) {
  if (!last) finalize_backward();
}

}  // namespace meshtrain::parallel
