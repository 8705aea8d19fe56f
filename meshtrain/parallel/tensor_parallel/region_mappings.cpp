#include "meshtrain/parallel/tensor_parallel/region_mappings.h"

#include <memory>
#include <vector>

#include "meshtrain/autograd/function.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/storage.h"

namespace meshtrain::parallel::tp {
namespace {

void check_input(const Tensor& x, const comm::ProcessGroupPtr& group, const char* op) {
  MT_CHECK(group != nullptr, op, ": no tensor-parallel group");
  MT_CHECK(x.defined() && x.dtype() == DType::f32, op, ": expects an f32 tensor, got ",
           x.defined() ? x.str() : std::string("undefined"));
}

// Sum over the group, into a fresh tensor (the input may be saved by another node).
Tensor all_reduce_copy(const Tensor& x, const comm::ProcessGroupPtr& group) {
  Tensor out = x.clone();
  if (group->size() > 1) {
    comm::AllReduceOptions opts;
    opts.async_op = false;
    group->all_reduce(out.data_ptr(), static_cast<size_t>(out.numel()), DType::f32, opts)->wait();
  }
  return out;
}

// Regroups [B, P, inner] (P parts of a time range) as [P, B, inner], or back (to_parts = false),
// so that part p of every batch row is one contiguous block p as the collectives want it: one
// strided copy a part, where the tensor is.
Tensor regroup(const Tensor& x, int64_t B, int64_t P, int64_t inner, bool to_parts) {
  const Device d = x.device();
  Tensor out = Tensor::empty(x.shape(), DType::f32, d);
  const auto* src = static_cast<const char*>(x.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  const size_t row = static_cast<size_t>(inner) * sizeof(float);
  for (int64_t p = 0; p < P; ++p) {
    const size_t in_parts = static_cast<size_t>(p * B) * row,
                 in_rows = static_cast<size_t>(p) * row;
    if (to_parts)
      allocator_for(d.type).copy_2d(dst + in_parts, row, d, src + in_rows,
                                    static_cast<size_t>(P) * row, d, row, static_cast<size_t>(B));
    else
      allocator_for(d.type).copy_2d(dst + in_rows, static_cast<size_t>(P) * row, d, src + in_parts,
                                    row, d, row, static_cast<size_t>(B));
  }
  return out;
}

// The time-split shape arithmetic shared by the sequence-parallel pair.
struct SeqSplit {
  int64_t B = 0, inner = 0;  // inner: elements per time step
  Shape full, part;
};

SeqSplit seq_split_of_full(const Tensor& x, int size, const char* op) {
  MT_CHECK(x.dim() >= 2, op, ": expects [B, T, ...], got ", shape_str(x.shape()));
  MT_CHECK(x.size(1) % size == 0, op, ": sequence length ", x.size(1),
           " is not divisible by the tensor-parallel size ", size);
  SeqSplit s;
  s.B = x.size(0);
  s.full = x.shape();
  s.part = x.shape();
  s.part[1] /= size;
  s.inner = s.B == 0 ? 0 : x.numel() / (s.B * size);  // elements of one batch row's part
  return s;
}

SeqSplit seq_split_of_part(const Tensor& x, int size, const char* op) {
  MT_CHECK(x.dim() >= 2, op, ": expects [B, T / tp, ...], got ", shape_str(x.shape()));
  SeqSplit s;
  s.B = x.size(0);
  s.part = x.shape();
  s.full = x.shape();
  s.full[1] *= size;
  s.inner = s.B == 0 ? 0 : x.numel() / s.B;
  return s;
}

// part[B, T / P, ...] of every rank -> full[B, T, ...].
Tensor all_gather_time(const Tensor& part, const SeqSplit& s, const comm::ProcessGroupPtr& group) {
  const int P = group->size();
  Tensor parts = Tensor::empty(s.full, DType::f32, part.device());  // [P, B, inner] in memory
  comm::AllGatherOptions opts;
  opts.async_op = false;
  group
      ->all_gather(part.data_ptr(), parts.data_ptr(), static_cast<size_t>(part.numel()), DType::f32,
                   opts)
      ->wait();
  return regroup(parts, s.B, P, s.inner, /*to_parts=*/false);
}

// full[B, T, ...] partial sums on every rank -> this rank's part of their sum [B, T / P, ...].
Tensor reduce_scatter_time(const Tensor& full, const SeqSplit& s,
                           const comm::ProcessGroupPtr& group) {
  const int P = group->size();
  Tensor parts = regroup(full, s.B, P, s.inner, /*to_parts=*/true);
  Tensor out = Tensor::empty(s.part, DType::f32, full.device());
  comm::ReduceScatterOptions opts;
  opts.async_op = false;
  group
      ->reduce_scatter(parts.data_ptr(), out.data_ptr(), static_cast<size_t>(out.numel()),
                       DType::f32, opts)
      ->wait();
  return out;
}

class CopyToTpRegion final : public autograd::Function {
 public:
  explicit CopyToTpRegion(comm::ProcessGroupPtr group) : group_(std::move(group)) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return {in[0]}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    return {all_reduce_copy(g[0], group_)};
  }
  std::string name() const override { return "CopyToTpRegion"; }

 private:
  comm::ProcessGroupPtr group_;
};

class ReduceFromTpRegion final : public autograd::Function {
 public:
  explicit ReduceFromTpRegion(comm::ProcessGroupPtr group) : group_(std::move(group)) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    return {all_reduce_copy(in[0], group_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override { return {g[0]}; }
  std::string name() const override { return "ReduceFromTpRegion"; }

 private:
  comm::ProcessGroupPtr group_;
};

class GatherFromSequenceParallel final : public autograd::Function {
 public:
  explicit GatherFromSequenceParallel(comm::ProcessGroupPtr group) : group_(std::move(group)) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    split_ = seq_split_of_part(in[0], group_->size(), "gather_from_sequence_parallel");
    if (group_->size() == 1) return {in[0]};
    return {all_gather_time(in[0], split_, group_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    if (group_->size() == 1) return {g[0]};
    return {reduce_scatter_time(g[0], split_, group_)};
  }
  std::string name() const override { return "GatherFromSequenceParallel"; }

 private:
  comm::ProcessGroupPtr group_;
  SeqSplit split_;
};

class ReduceScatterToSequenceParallel final : public autograd::Function {
 public:
  explicit ReduceScatterToSequenceParallel(comm::ProcessGroupPtr group)
      : group_(std::move(group)) {}
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    split_ = seq_split_of_full(in[0], group_->size(), "reduce_scatter_to_sequence_parallel");
    if (group_->size() == 1) return {in[0]};
    return {reduce_scatter_time(in[0], split_, group_)};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& g) override {
    if (group_->size() == 1) return {g[0]};
    return {all_gather_time(g[0], split_, group_)};
  }
  std::string name() const override { return "ReduceScatterToSequenceParallel"; }

 private:
  comm::ProcessGroupPtr group_;
  SeqSplit split_;
};

template <typename F>
Tensor apply_one(const Tensor& x, const comm::ProcessGroupPtr& group, const char* op) {
  check_input(x, group, op);
  return autograd::Function::apply(std::make_shared<F>(group), {x})[0];
}

}  // namespace

Tensor copy_to_tp_region(const Tensor& x, const comm::ProcessGroupPtr& group) {
  return apply_one<CopyToTpRegion>(x, group, "copy_to_tp_region");
}

Tensor reduce_from_tp_region(const Tensor& x, const comm::ProcessGroupPtr& group) {
  return apply_one<ReduceFromTpRegion>(x, group, "reduce_from_tp_region");
}

Tensor gather_from_sequence_parallel(const Tensor& x, const comm::ProcessGroupPtr& group) {
  return apply_one<GatherFromSequenceParallel>(x, group, "gather_from_sequence_parallel");
}

Tensor reduce_scatter_to_sequence_parallel(const Tensor& x, const comm::ProcessGroupPtr& group) {
  return apply_one<ReduceScatterToSequenceParallel>(x, group,
                                                    "reduce_scatter_to_sequence_parallel");
}

Tensor sequence_chunk(const Tensor& x, int rank, int size) {
  MT_CHECK(x.dim() >= 2 && x.size(1) % size == 0, "sequence_chunk: ", shape_str(x.shape()),
           " does not split into ", size, " equal time ranges");
  const int64_t Tp = x.size(1) / size;
  return ops::narrow(x, 1, rank * Tp, Tp);
}

}  // namespace meshtrain::parallel::tp
