// Tensor-parallel GPT against the plain model on the same batches: tp = 2 and 4, with and
// without sequence parallelism, ranks as threads over shm. The loss agrees at every one of 20
// AdamW steps, each rank's gradients are its slices of the whole model's, and the collectives
// of a step move exactly the bytes the Megatron formula says.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/collective_observer.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/parallel/tensor_parallel/tp_gpt.h"
#include "meshtrain/parallel/tensor_parallel/whole_parameters.h"
#include "meshtrain/tensor/random.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain::parallel::tp {
namespace {

constexpr int64_t kB = 2, kT = 8, kSteps = 20;

nn::GPTConfig tiny(float dropout = 0.0f, bool tie = true) {
  nn::GPTConfig c;
  c.vocab_size = 31;  // pads to 32 over 2 or 4 ranks
  c.block_size = 16;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 16;
  c.dropout = dropout;
  c.tie_embeddings = tie;
  c.seed = 9;
  return c;
}

std::pair<Tensor, Tensor> batch(int64_t step) {
  Generator g(500 + static_cast<uint64_t>(step));
  std::vector<int32_t> x(static_cast<size_t>(kB * kT)), y(x.size());
  for (auto& t : x) t = static_cast<int32_t>(g.below(31));
  for (auto& t : y) t = static_cast<int32_t>(g.below(31));
  y[3] = -1;  // an ignored target
  return {Tensor::from_vector(x, {kB, kT}), Tensor::from_vector(y, {kB, kT})};
}

optim::AdamWOptions adamw() {
  optim::AdamWOptions o;
  o.lr = 1e-2f;
  o.weight_decay = 0.1f;
  return o;
}

struct Trace {
  std::vector<float> losses;                         // per step
  std::vector<std::map<std::string, Tensor>> grads;  // per step, by name (whole, or a shard)
};

template <typename Model>
void record_grads(const Model& m, Trace& t) {
  std::map<std::string, Tensor> g;
  for (auto& [name, p] : m.named_parameters()) g[name] = p.grad().clone();
  t.grads.push_back(std::move(g));
}

Trace train_plain(const nn::GPTConfig& config) {
  nn::GPT model(config);
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1f), adamw());
  Trace t;
  for (int64_t s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s);
    model.zero_grad();
    Tensor loss = model.loss(x, y, 77 + static_cast<uint64_t>(s));
    autograd::backward(loss);
    t.losses.push_back(loss.item());
    record_grads(model, t);
    opt.step();
  }
  return t;
}

Trace train_tp(const nn::GPTConfig& config, const TpContext& tp) {
  omp_set_num_threads(1);
  TpGPT model(config, tp);
  optim::AdamW opt(optim::decay_groups(model.named_parameters(), 0.1f), adamw());
  Trace t;
  for (int64_t s = 0; s < kSteps; ++s) {
    auto [x, y] = batch(s);
    model.zero_grad();
    Tensor loss = model.loss(x, y, 77 + static_cast<uint64_t>(s));
    autograd::backward(loss);
    model.reduce_sequence_parallel_grads();
    t.losses.push_back(loss.item());
    record_grads(model, t);
    opt.step();
  }
  return t;
}

// max |a - b| <= tol * max(1, max |b|): gradients of near-zero elements are compared against the
// tensor's scale, not their own.
void expect_tensor_close(const Tensor& a, const Tensor& b, double tol, const std::string& what) {
  ASSERT_EQ(a.shape(), b.shape()) << what;
  const std::vector<float> va = a.to_vector(), vb = b.to_vector();
  double scale = 1e-3, worst = 0;
  for (float v : vb) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::fabs(double(va[i]) - vb[i]));
  EXPECT_LE(worst, tol * scale) << what << " (scale " << scale << ")";
}

void compare(int tp_size, bool sp, const nn::GPTConfig& config) {
  const Trace ref = train_plain(config);
  std::vector<Trace> ranks(static_cast<size_t>(tp_size));
  std::vector<std::vector<nn::ParamInfo>> infos(static_cast<size_t>(tp_size));
  testing::run_shm_ranks(tp_size, [&](int r, const comm::ProcessGroupPtr& group) {
    ranks[static_cast<size_t>(r)] = train_tp(config, TpContext{group, sp});
    infos[static_cast<size_t>(r)] = TpGPT(config, TpContext{group, sp}).param_infos();
  });
  const std::string what = "tp " + std::to_string(tp_size) + (sp ? " sp" : "");
  for (int r = 0; r < tp_size; ++r) {
    const Trace& t = ranks[static_cast<size_t>(r)];
    for (int64_t s = 0; s < kSteps; ++s)
      EXPECT_NEAR(t.losses[s], ref.losses[s], 1e-5 * std::fabs(ref.losses[s]))
          << what << " rank " << r << " step " << s;
    // Gradients at the first step (identical parameters) and the last (after 19 updates).
    for (int64_t s : {int64_t{0}, kSteps - 1}) {
      for (const nn::ParamInfo& info : infos[static_cast<size_t>(r)]) {
        const Tensor& whole = ref.grads[s].at(info.name);
        const Tensor expected = info.init.shard.defined() ? info.init.shard.take(whole) : whole;
        expect_tensor_close(
            t.grads[s].at(info.name), expected, s == 0 ? 1e-5 : 1e-3,
            what + " rank " + std::to_string(r) + " step " + std::to_string(s) + " " + info.name);
      }
    }
  }
}

TEST(TensorParallel, TwoRanksMatchOneRank) {
  compare(2, false, tiny());
}
TEST(TensorParallel, FourRanksMatchOneRank) {
  compare(4, false, tiny());
}
TEST(TensorParallel, TwoRanksWithSequenceParallelismMatchOneRank) {
  compare(2, true, tiny());
}
TEST(TensorParallel, FourRanksWithSequenceParallelismMatchOneRank) {
  compare(4, true, tiny());
}
// Dropout masks, untied head, checkpointed blocks: the same trajectory too.
TEST(TensorParallel, DropoutUntiedHeadAndCheckpointingMatchOneRank) {
  nn::GPTConfig c = tiny(0.1f, false);
  c.checkpointed_blocks = nn::parse_activation_checkpointing("every:2", c.n_layer);
  compare(2, false, c);
  compare(2, true, c);
}

TEST(TensorParallel, ShardsAreSlicesOfTheWholeModelWithShardPlacements) {
  const nn::GPTConfig config = tiny();
  const nn::GPT whole(config);
  std::map<std::string, Tensor> values;
  for (auto& [n, p] : whole.named_parameters()) values[n] = p;
  testing::run_shm_ranks(2, [&](int, const comm::ProcessGroupPtr& group) {
    const TpGPT model(config, TpContext{group, false});
    const auto infos = model.param_infos();
    const auto params = model.named_parameters();
    ASSERT_EQ(params.size(), values.size());
    std::map<std::string, std::string> placement;
    for (size_t i = 0; i < params.size(); ++i) {
      const nn::ParamInfo& info = infos[i];
      ASSERT_EQ(info.name, params[i].first);
      EXPECT_EQ(info.shape, values.at(info.name).shape()) << info.name;
      placement[info.name] = info.placement("tp").str();
      const Tensor expected = info.init.shard.defined() ? info.init.shard.take(values.at(info.name))
                                                        : values.at(info.name);
      EXPECT_EQ(params[i].second.to_vector(), expected.to_vector()) << info.name;
    }
    EXPECT_EQ(placement.at("wte.weight"), "Shard(0)");
    EXPECT_EQ(placement.at("wpe.weight"), "Replicate");
    EXPECT_EQ(placement.at("h.0.attn.c_attn.weight"), "Shard(0, blocks=3)");
    EXPECT_EQ(placement.at("h.0.attn.c_attn.bias"), "Shard(0, blocks=3)");
    EXPECT_EQ(placement.at("h.0.attn.c_proj.weight"), "Shard(1)");
    EXPECT_EQ(placement.at("h.0.attn.c_proj.bias"), "Replicate");
    EXPECT_EQ(placement.at("h.1.mlp.c_fc.weight"), "Shard(0)");
    EXPECT_EQ(placement.at("h.1.mlp.c_proj.weight"), "Shard(1)");
    EXPECT_EQ(placement.at("ln_f.weight"), "Replicate");
  });
}

// The inverse of the cut: gathering the shards of 4 ranks (the vocabulary padded 31 -> 32, q/k/v
// blocks) gives back the plain model's tensors bit for bit.
TEST(TensorParallel, WholeParametersGatherTheShardsBack) {
  nn::GPTConfig config = tiny(0.0f, false);
  const nn::GPT whole(config);
  std::map<std::string, std::vector<float>> values;
  for (auto& [n, p] : whole.named_parameters()) values[n] = p.to_vector();
  testing::run_shm_ranks(4, [&](int, const comm::ProcessGroupPtr& group) {
    const TpGPT model(config, TpContext{group, true});
    const nn::NamedTensors gathered = whole_parameters(model);
    ASSERT_EQ(gathered.size(), values.size());
    for (const auto& [name, t] : gathered) EXPECT_EQ(t.to_vector(), values.at(name)) << name;
  });
}

TEST(TensorParallel, OneRankIsThePlainModel) {
  // tp = 1 builds through the plain factory: the same kernels, so the same bits.
  const nn::GPTConfig config = tiny(0.1f, false);
  EXPECT_EQ(gpt_layers(config, TpContext{}), nn::plain_gpt_layers());
  nn::GPT plain(config);
  TpGPT one(config, TpContext{});
  const auto [x, y] = batch(0);
  EXPECT_EQ(one.loss(x, y, 7).to_vector(), plain.loss(x, y, 7).to_vector());
  for (const nn::ParamInfo& info : one.param_infos())
    EXPECT_EQ(info.placement("tp").kind, nn::Placement::Kind::replicate) << info.name;
}

TEST(TensorParallel, BadLayoutsAreOneClearLine) {
  auto message = [](const nn::GPTConfig& c, int tp, bool sp) {
    try {
      validate_tensor_parallel(c, tp, sp);
    } catch (const ValueError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  nn::GPTConfig c = tiny();
  EXPECT_NE(message(c, 3, false).find("model.n_embd (16) is not divisible by parallel.tp (3)"),
            std::string::npos);
  c.n_embd = 24;
  c.n_head = 2;
  EXPECT_NE(message(c, 4, false).find("model.n_head (2) is not divisible by parallel.tp (4)"),
            std::string::npos);
  EXPECT_NE(message(tiny(), 1, true).find("parallel.sequence_parallel = true needs"),
            std::string::npos);
  EXPECT_EQ(message(tiny(), 4, true), "no error");
  for (const std::string& m : {message(tiny(), 3, false), message(tiny(), 1, true)})
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
}

}  // namespace
}  // namespace meshtrain::parallel::tp
