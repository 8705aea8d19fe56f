#include "meshtrain/nn/expert_route.h"

#include <cstring>
#include <memory>

#include "meshtrain/util/error.h"

namespace meshtrain::nn {

namespace {

// Copies `rows` rows of `t` (zeros where it is undefined) to `dst`.
void put_rows(float* dst, const Tensor& t, int64_t rows, int64_t channels) {
  const size_t n = static_cast<size_t>(rows * channels);
  if (n == 0) return;
  if (!t.defined()) {
    std::memset(dst, 0, n * sizeof(float));
    return;
  }
  MT_CHECK(t.numel() == rows * channels && t.dtype() == DType::f32, "expert exchange: a block of ",
           rows, " rows of ", channels, " f32 channels, got ", shape_str(t.shape()));
  // A device's rows come to the host first (the exchange's group moves host memory).
  const Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
  std::memcpy(dst, c.data<float>(), n * sizeof(float));
}

// The route's results where its rows live.
std::vector<Tensor> placed(std::vector<Tensor> host, Device device) {
  if (!device.is_cpu())
    for (Tensor& t : host) t = t.to(device);
  return host;
}

// Elements per peer from rows per (peer, local expert).
std::vector<size_t> per_peer(const std::vector<int64_t>& rows, size_t local, size_t channels) {
  std::vector<size_t> out(rows.size() / local, 0);
  for (size_t p = 0; p < out.size(); ++p)
    for (size_t j = 0; j < local; ++j)
      out[p] += static_cast<size_t>(rows[p * local + j]) * channels;
  return out;
}

size_t total(const std::vector<size_t>& v) {
  size_t n = 0;
  for (size_t x : v) n += x;
  return n;
}

}  // namespace

ExpertRoute::ExpertRoute(std::shared_ptr<ExpertExchange> exchange,
                         const std::vector<int64_t>& loads, int64_t channels, Device device)
    : exchange_(std::move(exchange)), channels_(channels), device_(device), loads_(loads) {
  MT_CHECK(exchange_ != nullptr, "an expert route needs an exchange");
  ranks_ = exchange_->size();
  const int64_t experts = static_cast<int64_t>(loads_.size());
  MT_CHECK(experts % ranks_ == 0, experts, " experts cannot be shared out over ", ranks_,
           " expert-parallel ranks");
  local_ = experts / ranks_;
  recv_ = exchange_->exchange_counts(loads_, static_cast<size_t>(local_));
  MT_CHECK(recv_.size() == loads_.size(), "expert exchange: ", recv_.size(), " counts back for ",
           loads_.size(), " sent");
}

std::vector<Tensor> ExpertRoute::to_experts(const std::vector<Tensor>& by_expert) const {
  MT_CHECK(by_expert.size() == loads_.size(), "expert exchange: ", by_expert.size(),
           " tensors for ", loads_.size(), " experts");
  const size_t L = static_cast<size_t>(local_), C = static_cast<size_t>(channels_);
  const std::vector<size_t> send = per_peer(loads_, L, C), recv = per_peer(recv_, L, C);
  const size_t send_total = total(send), recv_total = total(recv);
  // Expert-major is peer-major: each peer's experts are consecutive.
  // Every element is written before it is read: no zero-fill.
  const auto out_buf = std::make_unique_for_overwrite<float[]>(send_total);
  const auto in_buf = std::make_unique_for_overwrite<float[]>(recv_total);
  size_t at = 0;
  for (size_t e = 0; e < loads_.size(); ++e) {
    put_rows(out_buf.get() + at, by_expert[e], loads_[e], channels_);
    at += static_cast<size_t>(loads_[e]) * C;
  }
  exchange_->all_to_all(out_buf.get(), send, in_buf.get(), recv);
  std::vector<Tensor> local;
  for (size_t j = 0; j < L; ++j) {
    int64_t rows = 0;
    for (size_t s = 0; s < send.size(); ++s) rows += recv_[s * L + j];
    local.push_back(Tensor::empty({rows, channels_}));
  }
  // The received blocks are source-major; each local expert takes its block from every source.
  std::vector<size_t> filled(L, 0);
  at = 0;
  for (size_t s = 0; s < send.size(); ++s)
    for (size_t j = 0; j < L; ++j) {
      const size_t n = static_cast<size_t>(recv_[s * L + j]) * C;
      if (n) std::memcpy(local[j].data<float>() + filled[j], in_buf.get() + at, n * sizeof(float));
      filled[j] += n;
      at += n;
    }
  return placed(std::move(local), device_);
}

std::vector<Tensor> ExpertRoute::to_tokens(const std::vector<Tensor>& local) const {
  const size_t L = static_cast<size_t>(local_), C = static_cast<size_t>(channels_);
  MT_CHECK(local.size() == L, "expert exchange: ", local.size(), " tensors for ", L,
           " local experts");
  const std::vector<size_t> send = per_peer(recv_, L, C), recv = per_peer(loads_, L, C);
  const size_t send_total = total(send), recv_total = total(recv);
  // Every element is written before it is read: no zero-fill.
  const auto out_buf = std::make_unique_for_overwrite<float[]>(send_total);
  const auto in_buf = std::make_unique_for_overwrite<float[]>(recv_total);
  std::vector<Tensor> whole(L);
  for (size_t j = 0; j < L; ++j) {
    int64_t rows = 0;
    for (size_t s = 0; s < send.size(); ++s) rows += recv_[s * L + j];
    if (local[j].defined()) {
      MT_CHECK(local[j].numel() == rows * channels_, "expert exchange: local expert ", j,
               " returned ", shape_str(local[j].shape()), " for ", rows, " rows");
      whole[j] = local[j].device().is_cpu() ? local[j] : local[j].to(Device::cpu());
    }
  }
  // Back in the order the rows came: source-major, each source's rows of every local expert.
  std::vector<size_t> taken(L, 0);
  size_t at = 0;
  for (size_t s = 0; s < send.size(); ++s)
    for (size_t j = 0; j < L; ++j) {
      const size_t n = static_cast<size_t>(recv_[s * L + j]) * C;
      if (n) {
        if (whole[j].defined())
          std::memcpy(out_buf.get() + at, whole[j].data<float>() + taken[j], n * sizeof(float));
        else
          std::memset(out_buf.get() + at, 0, n * sizeof(float));
      }
      taken[j] += n;
      at += n;
    }
  exchange_->all_to_all(out_buf.get(), send, in_buf.get(), recv);
  std::vector<Tensor> by_expert;
  at = 0;
  for (size_t e = 0; e < loads_.size(); ++e) {
    Tensor t = Tensor::empty({loads_[e], channels_});
    const size_t n = static_cast<size_t>(loads_[e]) * C;
    if (n) std::memcpy(t.data<float>(), in_buf.get() + at, n * sizeof(float));
    at += n;
    by_expert.push_back(std::move(t));
  }
  return placed(std::move(by_expert), device_);
}

}  // namespace meshtrain::nn
