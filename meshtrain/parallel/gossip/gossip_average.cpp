#include "meshtrain/parallel/gossip/gossip_average.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "meshtrain/tensor/storage.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

namespace {

// Above the pipeline's tags (gossip never runs with a pipeline, but a stray message must not
// match); the low bits carry the round, so ranks a round apart fail instead of mixing rounds.
constexpr uint32_t kGossipTag = 0x60000000u;

uint32_t round_tag(int64_t round) {
  return kGossipTag | static_cast<uint32_t>(round & 0xFFFF);
}

float* flat(const comm::CommBuffer& b) {
  return reinterpret_cast<float*>(b.data());
}

// Bytes between host memory and a parameter wherever it lives (a device's through its
// allocator: the group moves host memory).
void to_host(float* dst, const Tensor& p) {
  if (p.device().is_cpu())
    std::memcpy(dst, p.data_ptr(), p.nbytes());
  else
    allocator_for(p.device().type).copy(dst, Device::cpu(), p.data_ptr(), p.device(), p.nbytes());
}

}  // namespace

GossipAverage::GossipAverage(const nn::NamedTensors& params, comm::ProcessGroupPtr replicas,
                             GossipGraph graph)
    : group_(std::move(replicas)), graph_(graph) {
  MT_CHECK(group_ != nullptr, "gossip averaging needs a data-parallel group");
  std::set<const void*> seen;
  for (const auto& [name, p] : params) {
    MT_CHECK(p.dtype() == DType::f32, "gossip averages f32 parameters; '", name, "' is ",
             dtype_name(p.dtype()));
    // A tied parameter appears under both names: it is averaged once.
    if (!seen.insert(p.data_ptr()).second) continue;
    params_.push_back(p);
    numel_ += static_cast<size_t>(p.numel());
  }
  size_t peers = 0;
  for (int64_t t = 0; t < exponential_period(group_->size()); ++t)
    peers = std::max(peers, gossip_round(graph_, group_->rank(), group_->size(), t).recvs.size());
  if (peers == 0) return;  // one replica: nothing to exchange
  mine_ = comm::CommBuffer::allocate_private(numel_ * sizeof(float));
  for (size_t i = 0; i < peers; ++i)
    theirs_.push_back(comm::CommBuffer::allocate_private(numel_ * sizeof(float)));
}

void GossipAverage::after_update() {
  const int me = group_->rank();
  const GossipRound r = gossip_round(graph_, me, group_->size(), round_);
  const uint32_t tag = round_tag(round_);
  ++round_;
  if (r.recvs.empty()) return;
  float* mine = flat(*mine_);
  size_t at = 0;
  for (const Tensor& p : params_) {
    to_host(mine + at, p);
    at += static_cast<size_t>(p.numel());
  }
  // Every transfer of the round is in flight before any is waited for; the transport moves them
  // in whatever order the peers get to theirs.
  std::vector<comm::WorkPtr> works;
  for (size_t i = 0; i < r.recvs.size(); ++i)
    works.push_back(group_->recv(flat(*theirs_[i]), numel_, DType::f32, r.recvs[i], tag));
  for (int peer : r.sends) works.push_back(group_->send(mine, numel_, DType::f32, peer, tag));
  std::exception_ptr failed;
  for (auto& w : works) {
    // Every transfer ends before its buffer can go, even after one failed (a failed group fails
    // the rest promptly).
    try {
      w->wait();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);

  std::vector<const float*> terms;
  for (int rank : r.terms) {
    if (rank == me) {
      terms.push_back(mine);
      continue;
    }
    const auto it = std::find(r.recvs.begin(), r.recvs.end(), rank);
    MT_CHECK(it != r.recvs.end(), "gossip: rank ", rank, " is summed but not received from");
    terms.push_back(flat(*theirs_[static_cast<size_t>(it - r.recvs.begin())]));
  }
  const float count = static_cast<float>(terms.size());
  at = 0;
  for (const Tensor& p : params_) {
    // A device's parameter is averaged into this rank's own flat copy (each element reads only
    // its own index of every term), then copied back.
    const bool host = p.device().is_cpu();
    float* out = host ? p.data<float>() : mine + at;
    const size_t n = static_cast<size_t>(p.numel());
    if (terms.size() == 2) {
      const float *a = terms[0] + at, *b = terms[1] + at;
      for (size_t k = 0; k < n; ++k) out[k] = (a[k] + b[k]) / count;
    } else if (terms.size() == 3) {
      const float *a = terms[0] + at, *b = terms[1] + at, *c = terms[2] + at;
      for (size_t k = 0; k < n; ++k) out[k] = (a[k] + b[k] + c[k]) / count;
    } else {
      for (size_t k = 0; k < n; ++k) {
        float s = terms[0][at + k];
        for (size_t j = 1; j < terms.size(); ++j) s += terms[j][at + k];
        out[k] = s / count;
      }
    }
    if (!host)
      allocator_for(p.device().type).copy(p.data_ptr(), p.device(), out, Device::cpu(), p.nbytes());
    at += n;
  }
}

std::string GossipAverage::describe() const {
  const std::string n = std::to_string(group_->size());
  if (graph_ == GossipGraph::ring) return "gossip averaging over a ring of " + n + " replicas";
  return "gossip averaging with one peer per step on an exponential graph of " + n + " replicas";
}

size_t GossipAverage::exchange_bytes() const {
  return theirs_.empty() ? 0 : (1 + theirs_.size()) * numel_ * sizeof(float);
}

}  // namespace meshtrain::parallel
