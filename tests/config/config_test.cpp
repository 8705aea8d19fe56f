// Training config: defaults, TOML files, --set overrides, error messages, dumps and hashes.
#include "meshtrain/runtime/config.h"

#include <gtest/gtest.h>

#include <set>

#include "meshtrain/util/error.h"
#include "tests/support/temp_dir.h"

namespace meshtrain::runtime {
namespace {

using meshtrain::testing::TempDir;
using meshtrain::testing::write_bytes;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ValueError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ValueError";
  return "";
}

TEST(Config, Defaults) {
  TrainConfig c = load_config("");
  EXPECT_EQ(c.model.n_layer, 4);
  EXPECT_EQ(c.model.n_head, 4);
  EXPECT_EQ(c.model.n_embd, 128);
  EXPECT_EQ(c.model.block_size, 128);
  EXPECT_EQ(c.model.vocab_size, 257);
  EXPECT_EQ(c.model.dropout, 0.0);
  EXPECT_TRUE(c.model.bias);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_EQ(c.data.dir, "data/fortunes");
  EXPECT_EQ(c.data.batch_size, 8);
  EXPECT_EQ(c.data.seed, 1337);
  EXPECT_EQ(c.data.val_batches, 8);
  EXPECT_EQ(c.optim.name, "adamw");
  EXPECT_DOUBLE_EQ(c.optim.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optim.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-8);
  EXPECT_FALSE(c.optim.nesterov);
  EXPECT_EQ(c.optim.schedule, "cosine");
  EXPECT_EQ(c.optim.warmup_steps, 20);
  EXPECT_EQ(c.optim.lr_scale_rule, "none");
  EXPECT_EQ(c.train.steps, 300);
  EXPECT_EQ(c.train.eval_interval, 50);
  EXPECT_EQ(c.train.threads, 0);
  EXPECT_EQ(c.train.out_dir, "runs/demo");
  EXPECT_TRUE(c.train.save_weights);
  EXPECT_EQ(c.train.sample_tokens, 200);
}

TEST(Config, SchemaIsCompleteAndUnique) {
  std::set<std::string_view> keys;
  for (const ConfigKey& k : config_schema()) {
    EXPECT_TRUE(keys.insert(k.key).second) << k.key;
    EXPECT_FALSE(k.help.empty()) << k.key;
    EXPECT_EQ(find_config_key(k.key), &k);
  }
  // One schema entry per key declared in the X-macro lists.
#define MT_COUNT_KEY(section, name, type, def, help) +1
#define MT_COUNT_GROUP_KEY(section, group, name, type, def, help) +1
  constexpr size_t kDeclared =
      0 MESHTRAIN_CONFIG_KEYS(MT_COUNT_KEY) MESHTRAIN_CONFIG_GROUP_KEYS(MT_COUNT_GROUP_KEY);
#undef MT_COUNT_GROUP_KEY
#undef MT_COUNT_KEY
  EXPECT_EQ(keys.size(), kDeclared);
  EXPECT_GE(keys.size(), 33u);
  std::string help = config_help();
  for (std::string_view k : keys) EXPECT_NE(help.find(k), std::string::npos) << k;
  EXPECT_NE(help.find("transformer blocks"), std::string::npos);
}

TEST(Config, TomlFileAndOverrides) {
  TempDir dir;
  const std::string path = dir.file("run.toml");
  write_bytes(path, R"(
# a small run; dotted keys before the first table
train.steps = 42
train.out_dir = "runs/x"

[model]
n_layer = 2
n_embd = 64
dropout = 0.1
bias = false

[optim]
name = "sgd"
lr = 1          # an integer is accepted for a float
nesterov = true
)");
  TrainConfig c = load_config(path, {"model.n_layer=6", "optim.lr=3e-4", "data.dir = other",
                                     "train.save_weights=false", "optim.schedule=\"linear\""});
  EXPECT_EQ(c.model.n_layer, 6);  // --set wins over the file
  EXPECT_EQ(c.model.n_embd, 64);
  EXPECT_DOUBLE_EQ(c.model.dropout, 0.1);
  EXPECT_FALSE(c.model.bias);
  EXPECT_EQ(c.optim.name, "sgd");
  EXPECT_DOUBLE_EQ(c.optim.lr, 3e-4);
  EXPECT_TRUE(c.optim.nesterov);
  EXPECT_EQ(c.train.steps, 42);
  EXPECT_EQ(c.train.out_dir, "runs/x");
  EXPECT_EQ(c.data.dir, "other");
  EXPECT_FALSE(c.train.save_weights);
  EXPECT_EQ(c.optim.schedule, "linear");
  EXPECT_EQ(c.model.n_head, 4);  // untouched keys keep defaults
}

TEST(Config, UnknownKeySuggestsClosest) {
  TempDir dir;
  const std::string path = dir.file("typo.toml");
  write_bytes(path, "[model]\nn_layers = 3\n");
  std::string msg = error_of([&] { load_config(path); });
  EXPECT_NE(msg.find("model.n_layers"), std::string::npos) << msg;
  EXPECT_NE(msg.find(path), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'model.n_layer'"), std::string::npos) << msg;

  msg = error_of([] { load_config("", {"optim.weight_decy=0.2"}); });
  EXPECT_NE(msg.find("optim.weight_decy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'optim.weight_decay'"), std::string::npos) << msg;

  msg = error_of([] { load_config("", {"train.lr=0.1"}); });  // right name, wrong section
  EXPECT_NE(msg.find("did you mean 'optim.lr'"), std::string::npos) << msg;

  msg = error_of([] { load_config("", {"zzzzzzzz.qqqqqqq=1"}); });
  EXPECT_EQ(msg.find("did you mean"), std::string::npos) << msg;

  write_bytes(path, "[modle]\nn_layer = 3\n");
  msg = error_of([&] { load_config(path); });
  EXPECT_NE(msg.find("modle.n_layer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("did you mean 'model.n_layer'"), std::string::npos) << msg;
  write_bytes(path, "steps = 3\n");
  msg = error_of([&] { load_config(path); });
  EXPECT_NE(msg.find("'steps'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("train.steps"), std::string::npos) << msg;
}

TEST(Config, WrongTypeNamesKeyTypeAndValue) {
  TempDir dir;
  const std::string path = dir.file("types.toml");
  write_bytes(path, "[model]\nn_layer = \"four\"\n");
  std::string msg = error_of([&] { load_config(path); });
  EXPECT_NE(msg.find("model.n_layer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("integer"), std::string::npos) << msg;
  EXPECT_NE(msg.find("four"), std::string::npos) << msg;

  write_bytes(path, "[model]\nn_layer = 4.5\n");
  msg = error_of([&] { load_config(path); });
  EXPECT_NE(msg.find("4.5"), std::string::npos) << msg;

  write_bytes(path, "[model]\nbias = [1, 2]\n");
  msg = error_of([&] { load_config(path); });
  EXPECT_NE(msg.find("model.bias"), std::string::npos) << msg;
  EXPECT_NE(msg.find("boolean"), std::string::npos) << msg;

  msg = error_of([] { load_config("", {"optim.lr=fast"}); });
  EXPECT_NE(msg.find("optim.lr"), std::string::npos) << msg;
  EXPECT_NE(msg.find("float"), std::string::npos) << msg;
  EXPECT_NE(msg.find("fast"), std::string::npos) << msg;
  msg = error_of([] { load_config("", {"model.bias=maybe"}); });
  EXPECT_NE(msg.find("maybe"), std::string::npos) << msg;
  msg = error_of([] { load_config("", {"model.n_layer"}); });
  EXPECT_NE(msg.find("section.key=value"), std::string::npos) << msg;
}

TEST(Config, FileAndValueErrors) {
  TempDir dir;
  try {
    load_config(dir.file("absent.toml"));
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.toml"), std::string::npos);
  }
  write_bytes(dir.file("broken.toml"), "[model\nn_layer = 4\n");
  std::string msg = error_of([&] { load_config(dir.file("broken.toml")); });
  EXPECT_NE(msg.find("broken.toml:1"), std::string::npos) << msg;

  msg = error_of([] { load_config("", {"model.n_embd=130"}); });
  EXPECT_NE(msg.find("divisible"), std::string::npos) << msg;
  msg = error_of([] { load_config("", {"optim.name=lion"}); });
  EXPECT_NE(msg.find("adamw, sgd"), std::string::npos) << msg;
  EXPECT_THROW(load_config("", {"data.batch_size=0"}), ValueError);
  EXPECT_THROW(load_config("", {"optim.beta2=1.5"}), ValueError);
}

TEST(Config, DumpsRoundTripAndHash) {
  TrainConfig c = load_config("", {"model.n_layer=3", "optim.lr=2.5e-4", "optim.eps=1e-12",
                                   "train.out_dir=runs/with \"quotes\"", "model.dropout=0"});
  TempDir dir;
  const std::string path = dir.file("dump.toml");
  write_bytes(path, to_toml(c));
  TrainConfig back = load_config(path);
  EXPECT_EQ(to_toml(back), to_toml(c));
  EXPECT_EQ(back.optim.eps, 1e-12);
  EXPECT_EQ(back.train.out_dir, "runs/with \"quotes\"");
  EXPECT_EQ(config_hash(back), config_hash(c));

  nlohmann::ordered_json j = to_json(c);
  EXPECT_EQ(j["model"]["n_layer"], 3);
  EXPECT_EQ(j["optim"]["name"], "adamw");
  TrainConfig from_j = config_from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(config_hash(from_j), config_hash(c));

  TrainConfig d = c;
  d.train.seed += 1;
  EXPECT_NE(config_hash(d), config_hash(c));
  EXPECT_NE(to_toml(c).find("[optim]"), std::string::npos);
  EXPECT_NE(to_toml(c).find("lr = 0.00025"), std::string::npos) << to_toml(c);
}

}  // namespace
}  // namespace meshtrain::runtime

namespace meshtrain::runtime {
namespace {

TEST(Config, GroupKeysFromTablesDottedKeysOverridesAndJson) {
  TempDir dir;
  const std::string path = dir.file("moe.toml");
  write_bytes(path, R"(
[model]
n_layer = 2

[model.moe]
every = 1
num_experts = 4
top_k = 2
)");
  TrainConfig c = load_config(path, {"model.moe.capacity_factor=1.5"});
  EXPECT_EQ(c.model.moe_every, 1);
  EXPECT_EQ(c.model.moe_num_experts, 4);
  EXPECT_EQ(c.model.moe_top_k, 2);
  EXPECT_DOUBLE_EQ(c.model.moe_capacity_factor, 1.5);
  // The dump is one [model] table with dotted keys, and reads back the same.
  const std::string toml = to_toml(c);
  EXPECT_NE(toml.find("moe.num_experts = 4"), std::string::npos) << toml;
  const std::string again = dir.file("again.toml");
  write_bytes(again, toml);
  EXPECT_EQ(config_hash(load_config(again)), config_hash(c));
  EXPECT_EQ(config_hash(config_from_json(to_json(c))), config_hash(c));
  // A misspelt group key is named, with the closest known key.
  try {
    (void)load_config("", {"model.moe.num_expert=3"});
    ADD_FAILURE() << "unknown key accepted";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("model.moe.num_experts"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace meshtrain::runtime

namespace meshtrain::runtime {
namespace {

// A replication mode other than ddp keeps the whole model on every replica: what splits it over
// ranks is refused in one line naming both keys, and so are a mode's keys outside it.
TEST(Config, ParameterServerAndGossipRefuseWhatSplitsTheModel) {
  for (const auto& [overrides, expected] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"parallel.mode=parameter_server", "parallel.zero_stage=1"},
            "parallel.mode = \"parameter_server\" and parallel.zero_stage = 1 cannot be combined"},
           {{"parallel.mode=gossip", "parallel.pp=2"},
            "parallel.mode = \"gossip\" and parallel.pp = 2 cannot be combined"},
           {{"parallel.mode=gossip", "dist.comm_hook=f16"},
            "parallel.mode = \"gossip\" and dist.comm_hook = \"f16\" cannot be combined"},
           {{"parallel.mode=parameter_server", "parallel.ps.consistency=async",
             "parallel.ps.backup_workers=1"},
            "parallel.ps.backup_workers = 1 cannot be combined: backup workers drop"},
           {{"parallel.mode=parameter_server", "parallel.ps.consistency=eventual"},
            "parallel.ps.consistency"}}) {
    try {
      load_config("", overrides);
      ADD_FAILURE() << overrides.back() << " was accepted";
    } catch (const ValueError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(expected), std::string::npos) << msg;
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    }
  }
  const TrainConfig c = load_config(
      "", {"parallel.mode=parameter_server", "parallel.ps.servers=2", "parallel.ps.consistency=ssp",
           "parallel.ps.staleness=3", "elastic.drop_stragglers=true"});
  EXPECT_EQ(c.parallel.ps_servers, 2);
  EXPECT_EQ(c.parallel.ps_consistency, "ssp");
  EXPECT_TRUE(c.elastic.drop_stragglers);
}

}  // namespace
}  // namespace meshtrain::runtime
