// SGD and AdamW against torch.optim on the same inputs: ten steps with changing learning
// rates, two parameter groups with different weight decay, and a parameter that misses its
// gradient in one step (per-parameter step counts). Every parameter after every step must agree
// to 1e-6 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/sgd.h"
#include "tests/support/capability.h"
#include "torch_reference.h"

namespace meshtrain::optim {
namespace {

using nlohmann::json;

constexpr int kSteps = 10;

struct ParamSpec {
  std::string name;
  Shape shape;
  int group;
};

struct Problem {
  std::vector<ParamSpec> params;
  std::vector<float> group_decay;
  std::vector<std::vector<float>> init;                // [param]
  std::vector<std::vector<std::vector<float>>> grads;  // [step][param], empty = no grad
  std::vector<float> lrs;                              // [step]
};

Problem make_problem(uint32_t seed, float wd0, float wd1, float lr, bool skip_one_grad) {
  Problem pb;
  pb.params = {{"h.0.w", {4, 3}, 0}, {"h.0.b", {3}, 1}, {"emb", {2, 2, 2}, 0}, {"ln.g", {5}, 1}};
  pb.group_decay = {wd0, wd1};
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  for (const auto& p : pb.params) {
    std::vector<float> v(static_cast<size_t>(shape_numel(p.shape)));
    for (float& x : v) x = uni(rng);
    pb.init.push_back(v);
  }
  for (int s = 0; s < kSteps; ++s) {
    std::vector<std::vector<float>> step;
    for (size_t i = 0; i < pb.params.size(); ++i) {
      std::vector<float> g(pb.init[i].size());
      // Mixed magnitudes, so that eps and the square roots matter.
      for (float& x : g) x = uni(rng) * (i == 3 ? 1e-3f : 2.0f);
      if (skip_one_grad && i == 1 && (s == 2 || s == 3)) g.clear();
      step.push_back(g);
    }
    pb.grads.push_back(step);
    pb.lrs.push_back(lr * (1.0f - 0.05f * static_cast<float>(s)));
  }
  return pb;
}

json spec_of(const Problem& pb, const std::string& optimizer, const json& options) {
  json spec;
  spec["optimizer"] = optimizer;
  spec["options"] = options;
  spec["groups"] = json::array();
  for (size_t g = 0; g < pb.group_decay.size(); ++g) {
    json group;
    group["weight_decay"] = pb.group_decay[g];
    group["params"] = json::array();
    for (size_t i = 0; i < pb.params.size(); ++i) {
      if (pb.params[i].group != static_cast<int>(g)) continue;
      group["params"].push_back(
          {{"name", pb.params[i].name}, {"shape", pb.params[i].shape}, {"init", pb.init[i]}});
    }
    spec["groups"].push_back(group);
  }
  spec["steps"] = json::array();
  for (int s = 0; s < kSteps; ++s) {
    json grads = json::object();
    for (size_t i = 0; i < pb.params.size(); ++i) {
      if (pb.grads[s][i].empty()) {
        grads[pb.params[i].name] = nullptr;
      } else {
        grads[pb.params[i].name] = pb.grads[s][i];
      }
    }
    spec["steps"].push_back({{"lr", pb.lrs[s]}, {"grads", grads}});
  }
  return spec;
}

// Runs our optimizer on the problem and compares with the reference after every step.
template <typename Opt, typename Options>
void run_and_compare(const Problem& pb, const Options& options, const json& reference) {
  std::vector<Tensor> tensors;
  std::vector<ParamGroup> groups(pb.group_decay.size());
  for (size_t g = 0; g < groups.size(); ++g) groups[g].weight_decay = pb.group_decay[g];
  for (size_t i = 0; i < pb.params.size(); ++i) {
    Tensor t = Tensor::from_vector(pb.init[i], pb.params[i].shape);
    t.set_requires_grad(true);
    tensors.push_back(t);
    groups[static_cast<size_t>(pb.params[i].group)].params.emplace_back(pb.params[i].name, t);
  }
  Opt opt(groups, options);
  ASSERT_EQ(reference["params"].size(), static_cast<size_t>(kSteps));
  double worst = 0.0;
  for (int s = 0; s < kSteps; ++s) {
    opt.set_lr(pb.lrs[s]);
    for (size_t i = 0; i < pb.params.size(); ++i) {
      if (pb.grads[s][i].empty()) {
        tensors[i].set_grad(Tensor());
      } else {
        tensors[i].set_grad(Tensor::from_vector(pb.grads[s][i], pb.params[i].shape));
      }
    }
    opt.step();
    for (size_t i = 0; i < pb.params.size(); ++i) {
      const auto ref = reference["params"][s][pb.params[i].name].get<std::vector<double>>();
      const std::vector<float> ours = tensors[i].to_vector();
      ASSERT_EQ(ref.size(), ours.size());
      for (size_t k = 0; k < ours.size(); ++k) {
        const double diff = std::abs(static_cast<double>(ours[k]) - ref[k]);
        // 1e-6 relative; the floor covers values that pass through zero.
        const double tol = 1e-6 * std::max(std::abs(ref[k]), 1e-1);
        worst = std::max(worst, diff / std::max(std::abs(ref[k]), 1e-1));
        ASSERT_LE(diff, tol) << pb.params[i].name << "[" << k << "] step " << s + 1 << ": ours "
                             << ours[k] << " torch " << ref[k];
      }
    }
  }
  ::testing::Test::RecordProperty("worst_relative_difference", std::to_string(worst));
  std::printf("worst relative difference to torch: %.3g\n", worst);
}

struct Case {
  std::string name;
  Problem problem;
  std::string optimizer;
  json options;  // the reference's spelling of the options
  std::function<void(const Problem&, const json&)> run;
};

template <typename Opt, typename Options>
Case make_case(std::string name, Problem pb, std::string optimizer, json options, Options ours) {
  auto run = [ours](const Problem& p, const json& ref) { run_and_compare<Opt>(p, ours, ref); };
  return Case{std::move(name), std::move(pb), std::move(optimizer), std::move(options), run};
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> c;
    c.push_back(make_case<Sgd>("SgdPlain", make_problem(1, 0.0f, 0.0f, 0.1f, false), "sgd",
                               {{"lr", 0.1}}, SgdOptions{.lr = 0.1f}));
    c.push_back(make_case<Sgd>("SgdMomentumWeightDecay", make_problem(2, 0.05f, 0.0f, 0.05f, true),
                               "sgd", {{"lr", 0.05}, {"momentum", 0.9}},
                               SgdOptions{.lr = 0.05f, .momentum = 0.9f}));
    c.push_back(make_case<Sgd>("SgdNesterov", make_problem(3, 0.01f, 0.0f, 0.05f, true), "sgd",
                               {{"lr", 0.05}, {"momentum", 0.8}, {"nesterov", true}},
                               SgdOptions{.lr = 0.05f, .momentum = 0.8f, .nesterov = true}));
    c.push_back(make_case<Sgd>("SgdDampening", make_problem(4, 0.1f, 0.02f, 0.05f, false), "sgd",
                               {{"lr", 0.05}, {"momentum", 0.9}, {"dampening", 0.3}},
                               SgdOptions{.lr = 0.05f, .momentum = 0.9f, .dampening = 0.3f}));
    c.push_back(make_case<AdamW>(
        "AdamWDefaults", make_problem(5, 0.01f, 0.01f, 1e-3f, false), "adamw",
        {{"lr", 1e-3}, {"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}}, AdamWOptions{}));
    const AdamWOptions gpt{.lr = 6e-4f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f};
    c.push_back(make_case<AdamW>(
        "AdamWGptSettingsWithMissingGrad", make_problem(6, 0.1f, 0.0f, gpt.lr, true), "adamw",
        {{"lr", gpt.lr}, {"beta1", gpt.beta1}, {"beta2", gpt.beta2}, {"eps", gpt.eps}}, gpt));
    const AdamWOptions big{.lr = 0.05f, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-3f};
    c.push_back(make_case<AdamW>(
        "AdamWLargeEpsAndLr", make_problem(7, 0.3f, 0.05f, big.lr, true), "adamw",
        {{"lr", big.lr}, {"beta1", big.beta1}, {"beta2", big.beta2}, {"eps", big.eps}}, big));
    return c;
  }();
  return all;
}

class TorchParity : public ::testing::TestWithParam<size_t> {
 protected:
  // One interpreter start for all the cases selected to run (importing torch takes seconds;
  // ctest runs each case in a process of its own).
  static void SetUpTestSuite() {
    if (!testing::torch_available()) return;
    const ::testing::TestSuite* suite = ::testing::UnitTest::GetInstance()->current_test_suite();
    std::vector<size_t> selected;
    for (size_t i = 0; i < cases().size(); ++i) {
      const std::string suffix = "/" + cases()[i].name;
      for (int t = 0; suite != nullptr && t < suite->total_test_count(); ++t) {
        const std::string name = suite->GetTestInfo(t)->name();
        if (suite->GetTestInfo(t)->should_run() && name.size() >= suffix.size() &&
            name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
          selected.push_back(i);
          break;
        }
      }
    }
    json spec;
    spec["cases"] = json::array();
    for (size_t i : selected) {
      const Case& c = cases()[i];
      spec["cases"].push_back(spec_of(c.problem, c.optimizer, c.options));
    }
    const json answer = testing::run_torch_reference(spec);
    results_ = new std::map<size_t, json>();
    for (size_t k = 0; k < selected.size(); ++k) (*results_)[selected[k]] = answer["results"][k];
  }
  static void TearDownTestSuite() {
    delete results_;
    results_ = nullptr;
  }
  void SetUp() override {
    MT_SKIP_UNLESS("torch", testing::torch_available(),
                   testing::kSystemPython << " cannot import torch (python3-torch missing)");
  }
  static std::map<size_t, json>* results_;
};

std::map<size_t, json>* TorchParity::results_ = nullptr;

TEST_P(TorchParity, MatchesTorchOverTenSteps) {
  ASSERT_NE(results_, nullptr);
  ASSERT_EQ(results_->count(GetParam()), 1u);
  const Case& c = cases()[GetParam()];
  c.run(c.problem, results_->at(GetParam()));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, TorchParity, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return cases()[info.param].name;
                         });

}  // namespace
}  // namespace meshtrain::optim
