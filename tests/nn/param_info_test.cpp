// ParamInfo and keyed initialisation: a parameter's initial values depend on the seed, its
// global name and its init rule only, so a model part built alone (a pipeline stage, an FSDP
// unit) can hold exactly the values the whole model would.
#include "meshtrain/nn/param_info.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "meshtrain/nn/gpt.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain::nn {
namespace {

GPTConfig config(int64_t layers) {
  GPTConfig c;
  c.vocab_size = 41;
  c.block_size = 8;
  c.n_layer = layers;
  c.n_head = 2;
  c.n_embd = 16;
  c.seed = 5;
  return c;
}

using testing::same_bits;

TEST(ParamInfo, ValuesDependOnTheNameNotOnWhatElseWasBuilt) {
  GPT shallow(config(2)), deep(config(5));
  std::map<std::string, Tensor> deep_params;
  for (auto& [name, t] : deep.named_parameters()) deep_params[name] = t;
  const std::vector<ParamInfo> infos = shallow.param_infos();
  int compared = 0;
  for (auto& [name, t] : shallow.named_parameters()) {
    // The residual projections' std scales with the depth (GPT-2's 0.02 / sqrt(2 L)), so they
    // legitimately differ between the two models; everything else must be the same bits.
    if (name.find("c_proj.weight") != std::string::npos) continue;
    ASSERT_TRUE(deep_params.count(name)) << name;
    EXPECT_TRUE(same_bits(t, deep_params[name])) << name << " differs between 2 and 5 layers";
    ++compared;
  }
  EXPECT_GT(compared, 10);
  // Different names draw different values; the same name with another seed too.
  EXPECT_FALSE(
      same_bits(shallow.named_parameters()[0].second, deep_params["wpe.weight"].slice(0, 8)));
  GPTConfig other = config(2);
  other.seed = 6;
  GPT reseeded(other);
  EXPECT_FALSE(
      same_bits(shallow.named_parameters()[0].second, reseeded.named_parameters()[0].second));
}

TEST(ParamInfo, DescribesDecayTiesAndInitOfEveryParameter) {
  GPT model(config(2));
  const std::vector<ParamInfo> infos = model.param_infos();
  const NamedTensors params = model.named_parameters();
  ASSERT_EQ(infos.size(), params.size());
  for (size_t i = 0; i < infos.size(); ++i) {
    const ParamInfo& info = infos[i];
    EXPECT_EQ(info.name, params[i].first);
    EXPECT_EQ(info.shape, params[i].second.shape());
    EXPECT_EQ(info.weight_decay, params[i].second.dim() >= 2) << info.name;
    EXPECT_EQ(info.placement("dp"), Placement::replicate()) << info.name;
    EXPECT_EQ(info.tie_group, info.name == "wte.weight" ? "wte" : "") << info.name;
    if (info.name.ends_with(".bias")) {
      EXPECT_EQ(info.init.kind, ParamInit::Kind::zeros) << info.name;
    }
    if (info.name.find("ln_") != std::string::npos && info.name.ends_with(".weight")) {
      EXPECT_EQ(info.init.kind, ParamInit::Kind::ones) << info.name;
    }
    if (info.name.find("c_fc.weight") != std::string::npos) {
      EXPECT_EQ(info.init.kind, ParamInit::Kind::normal);
      EXPECT_DOUBLE_EQ(info.init.std, 0.02);
    }
  }
  EXPECT_EQ(Placement::flat_shard(3, 9).str(), "FlatShard(3, 9)");
  EXPECT_EQ(Placement::shard(1).str(), "Shard(1)");
}

TEST(ParamInfo, AKeyedDrawHasTheRequestedSpread) {
  Tensor t = Tensor::empty({4096});
  init_parameter(t, ParamInit::normal(0.5), 9, "x.weight");
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    sum += t.data<float>()[i];
    sq += t.data<float>()[i] * t.data<float>()[i];
  }
  const double mean = sum / 4096, sd = std::sqrt(sq / 4096 - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.05);
  EXPECT_NEAR(sd, 0.5, 0.03);
}

}  // namespace
}  // namespace meshtrain::nn
