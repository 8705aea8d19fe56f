#include "meshtrain/parallel/expert/expert_groups.h"

#include <chrono>
#include <utility>

#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

namespace {

class GroupExpertExchange final : public nn::ExpertExchange {
 public:
  explicit GroupExpertExchange(comm::ProcessGroupPtr group) : group_(std::move(group)) {}
  int rank() const override { return group_->rank(); }
  int size() const override { return group_->size(); }

  std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, size_t per_peer) override {
    const Timed timed(seconds_);
    const size_t n = static_cast<size_t>(group_->size());
    MT_CHECK(send.size() == n * per_peer, "expert exchange: ", send.size(), " counts for ", n,
             " ranks of ", per_peer);
    std::vector<int64_t> recv(send.size());
    group_->all_to_all(send.data(), recv.data(), per_peer, DType::i64)->wait();
    return recv;
  }

  void all_to_all(const float* in, const std::vector<size_t>& send_elems, float* out,
                  const std::vector<size_t>& recv_elems) override {
    const Timed timed(seconds_);
    group_->all_to_all_v(in, send_elems, out, recv_elems, DType::f32)->wait();
  }

  double take_seconds() override { return std::exchange(seconds_, 0.0); }

 private:
  struct Timed {
    explicit Timed(double& total) : total_(total) {}
    ~Timed() {
      total_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    }
    double& total_;
    std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  };

  comm::ProcessGroupPtr group_;
  double seconds_ = 0;
};

}  // namespace

std::shared_ptr<nn::ExpertExchange> group_expert_exchange(comm::ProcessGroupPtr group) {
  MT_CHECK(group != nullptr, "an expert exchange needs a group");
  return std::make_shared<GroupExpertExchange>(std::move(group));
}

std::vector<int> expert_split_sizes(int dp, int ep) {
  if (ep <= 1 || dp % ep != 0) return {};
  std::vector<int> out(static_cast<size_t>(dp / ep), ep);
  if (dp / ep > 1) out.insert(out.end(), static_cast<size_t>(ep), dp / ep);
  return out;
}

comm::ProcessGroupPtr expert_replica_group(const comm::ProcessGroupPtr& dp, int ep) {
  MT_CHECK(dp != nullptr && ep > 1 && dp->size() % ep == 0, "parallel.ep = ", ep,
           " does not divide the data-parallel ranks");
  const int replicas = dp->size() / ep;
  comm::ProcessGroupPtr mine;
  if (replicas > 1)
    for (int c = 0; c < ep; ++c) {
      std::vector<int> ranks;
      for (int b = 0; b < replicas; ++b) ranks.push_back(b * ep + c);
      if (auto made = dp->split(ranks)) mine = std::move(made);
    }
  return mine;
}

ExpertGroups make_expert_groups(const comm::ProcessGroupPtr& dp, int ep) {
  MT_CHECK(dp != nullptr && ep > 1, "expert parallelism needs a data-parallel group and ep > 1");
  const int n = dp->size();
  MT_CHECK(n % ep == 0, "parallel.ep = ", ep, " does not divide the ", n, " data-parallel ranks");
  ExpertGroups g;
  g.ep = ep;
  g.replicas = n / ep;
  g.coord = dp->rank() % ep;
  g.replica = dp->rank() / ep;
  g.data_parallel = n;
  // A group of its own even where the block is the whole dp group: the token exchange runs
  // inside backward, beside the gradient buckets' collectives on the dp group.
  for (int b = 0; b < g.replicas; ++b) {
    std::vector<int> ranks;
    for (int i = 0; i < ep; ++i) ranks.push_back(b * ep + i);
    if (auto made = dp->split(ranks)) g.block = std::move(made);
  }
  g.replica_group = expert_replica_group(dp, ep);
  MT_CHECK(g.block != nullptr, "rank ", dp->rank(), " found no expert-parallel block");
  g.exchange = group_expert_exchange(g.block);
  return g;
}

}  // namespace meshtrain::parallel
