// The table of allowed values: it names real keys, dist.backend follows the backend registry, a
// bad value of every constrained key is one line naming key, value and allowed set, and
// --help-config shows the same sets.
#include "meshtrain/runtime/config_constraint.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/cuda/nccl/nccl_backend.h"
#include "meshtrain/parallel/ddp/comm_hook.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

std::string error_of(const std::string& assignment) {
  try {
    load_config("", {assignment});
  } catch (const ValueError& e) {
    return e.what();
  }
  ADD_FAILURE() << assignment << " was accepted";
  return "";
}

std::string number(double v, bool integer) {
  if (integer) return std::to_string(static_cast<int64_t>(v));
  std::ostringstream os;
  os << v;
  return os.str();
}

TEST(ConfigConstraint, EveryConstraintNamesAKeyOfItsKind) {
  ASSERT_GT(config_constraints().size(), 40u);
  std::set<std::string_view> seen;
  for (const ConfigConstraint& c : config_constraints()) {
    EXPECT_TRUE(seen.insert(c.key).second) << c.key << " has two constraints";
    const ConfigKey* key = find_config_key(c.key);
    ASSERT_NE(key, nullptr) << c.key << " is no config key";
    if (c.is_choice()) {
      EXPECT_EQ(key->type, ConfigType::kString) << c.key;
      EXPECT_FALSE(c.allowed_names().empty()) << c.key;
    } else {
      EXPECT_TRUE(key->type == ConfigType::kInt || key->type == ConfigType::kFloat) << c.key;
      EXPECT_TRUE(c.lo || c.hi) << c.key;
    }
  }
  // The defaults satisfy every constraint.
  EXPECT_NO_THROW(check_config_constraints(TrainConfig{}));
}

TEST(ConfigConstraint, DistBackendAllowsEveryBackendOfTheRegistry) {
  const ConfigConstraint* c = find_config_constraint("dist.backend");
  ASSERT_NE(c, nullptr);
  const bool has_nccl = cuda::register_nccl_backend();
  const auto allowed = c->allowed_names();
  for (const std::string& name : comm::registered_backends())
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), name), allowed.end()) << name;
  for (const char* name : {"auto", "shm", "tcp", "hier"})
    EXPECT_NE(std::find(allowed.begin(), allowed.end(), name), allowed.end()) << name;
  EXPECT_EQ(std::find(allowed.begin(), allowed.end(), "nccl") != allowed.end(), has_nccl);
  for (const std::string& name : allowed)
    EXPECT_NO_THROW(load_config("", {"dist.backend=" + name})) << name;
  const std::string msg = error_of("dist.backend=mpi");
  EXPECT_NE(msg.find("dist.backend = \"mpi\" is not one of: auto, "), std::string::npos) << msg;
  EXPECT_NE(msg.find("hier"), std::string::npos) << msg;
}

// For each constrained key, a value just outside what it allows: a name no choice has, or a
// number below the lower or above the upper bound.
TEST(ConfigConstraint, ABadValueOfEachKeyIsOneLineNamingKeyValueAndAllowedSet) {
  size_t checked = 0;
  for (const ConfigConstraint& c : config_constraints()) {
    const ConfigKey* key = find_config_key(c.key);
    ASSERT_NE(key, nullptr);
    const bool integer = key->type == ConfigType::kInt;
    std::vector<std::string> bad;
    if (c.is_choice()) {
      if (!c.otherwise.empty()) continue;  // any other value is a path (ckpt.resume_from)
      bad.push_back("no_such_choice");
      if (c.parametric) bad.push_back("no_such_choice:1");
    } else {
      if (c.lo) bad.push_back(number(c.lo_open ? *c.lo : *c.lo - 1, integer));
      if (c.hi && std::isfinite(*c.hi))
        bad.push_back(number(c.hi_open ? *c.hi : *c.hi + 1, integer));
    }
    for (const std::string& value : bad) {
      std::ostringstream quoted;  // a string value is shown in quotes
      if (key->type == ConfigType::kString) quoted << '"' << value << '"';
      const std::string text = key->type == ConfigType::kString ? quoted.str() : value;
      const std::string msg = error_of(std::string(c.key) + "=" + value);
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_TRUE(msg.starts_with("config: " + std::string(c.key))) << msg;
      EXPECT_NE(msg.find(text), std::string::npos) << c.key << ": " << msg;
      EXPECT_NE(msg.find(describe_constraint(c)), std::string::npos) << c.key << ": " << msg;
      ++checked;
    }
  }
  EXPECT_GT(checked, 50u);
}

TEST(ConfigConstraint, KindsOfMessages) {
  EXPECT_EQ(error_of("optim.name=adam"), "config: optim.name = \"adam\" is not one of: adamw, sgd");
  EXPECT_EQ(error_of("optim.beta2=1.5"), "config: optim.beta2 must be in [0, 1), got 1.5");
  EXPECT_EQ(error_of("data.batch_size=0"), "config: data.batch_size must be >= 1, got 0");
  EXPECT_EQ(error_of("optim.lr=0"), "config: optim.lr must be > 0, got 0");
  EXPECT_EQ(error_of("train.label_smoothing=1"),
            "config: train.label_smoothing must be in [0, 1), got 1");
  EXPECT_EQ(error_of("train.label_smoothing=-0.1"),
            "config: train.label_smoothing must be in [0, 1), got -0.1");
  EXPECT_NO_THROW(load_config("", {"model.kind=resnet", "data.kind=fashion_mnist",
                                   "train.label_smoothing=0.1", "optim.schedule=one_cycle"}));
  // The language model's loss has no smoothing: refused, not ignored.
  EXPECT_EQ(error_of("train.label_smoothing=0.1"),
            "config: train.label_smoothing = 0.1 applies to the ResNet's loss only; model.kind = "
            "\"gpt\" ignores it (use 0)");
  EXPECT_EQ(error_of("optim.pct_start=0"), "config: optim.pct_start must be in (0, 1), got 0");
  EXPECT_EQ(error_of("train.spike_zscore=inf"),
            "config: train.spike_zscore must be >= 0 and finite (0 = off), got inf");
  EXPECT_EQ(error_of("dist.comm_hook=\"zip:3\""),
            "config: dist.comm_hook = \"zip:3\" is not one of: allreduce, bf16, f16, topk, "
            "powersgd (topk[:RATIO], powersgd[:RANK[:WARMUP]])");
  EXPECT_NO_THROW(load_config("", {"dist.comm_hook=topk:0.01"}));
  EXPECT_NO_THROW(load_config("", {"dist.comm_hook=powersgd:4:10"}));
  EXPECT_EQ(error_of("dist.comm_hook=topk:2"),
            "config: dist.comm_hook = \"topk:2\": comm hook 'topk:2': the top-k ratio must be a "
            "number in (0, 1]");
  EXPECT_NO_THROW(load_config("", {"train.device=cuda:1"}));
}

// The hook names are the hook factory's: each one makes a hook, and the factory's own error
// lists the same names.
TEST(ConfigConstraint, CommHookNamesAreTheFactorys) {
  const ConfigConstraint* c = find_config_constraint("dist.comm_hook");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->allowed_names(), parallel::comm_hook_names());
  for (const std::string& name : c->allowed_names())
    EXPECT_NE(parallel::make_comm_hook(name), nullptr) << name;
  try {
    parallel::make_comm_hook("zip");
    ADD_FAILURE() << "zip made a hook";
  } catch (const ValueError& e) {
    for (const std::string& name : c->allowed_names())
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
  }
}

TEST(ConfigConstraint, HelpConfigShowsTheSameAllowedSets) {
  const std::string help = config_help();
  for (const ConfigConstraint& c : config_constraints()) {
    const size_t line = help.find("  " + std::string(c.key) + " = ");
    ASSERT_NE(line, std::string::npos) << c.key;
    const std::string text = help.substr(line, help.find('\n', line) - line);
    const std::string shown = detail::str_cat("[", describe_constraint(c), "]");
    EXPECT_NE(text.find(shown), std::string::npos) << text;
  }
}

}  // namespace
}  // namespace meshtrain::runtime
