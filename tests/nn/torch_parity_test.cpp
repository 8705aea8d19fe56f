// The external proof that the math is right: the same GPT, initial weights, batches and AdamW
// settings trained for 20 steps in meshtrain and in PyTorch (Debian's python3-torch) must give
// the same loss at every step, within 1e-4 relative.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/optim/lr_schedule.h"
#include "meshtrain/tensor/random.h"
#include "tests/support/capability.h"

namespace meshtrain {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

bool torch_available() {
  return std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

std::string run(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return {};
  std::string out;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) out += buf.data();
  const int status = pclose(p);
  EXPECT_EQ(WEXITSTATUS(status), 0) << "command failed: " << cmd << "\n" << out;
  return out;
}

TEST(TorchParity, TwentyAdamWStepsMatchPyTorch) {
  MT_SKIP_UNLESS("torch", torch_available(), kPython << " cannot import torch (python3-torch)");
  const auto dir =
      std::filesystem::temp_directory_path() / ("mt_parity_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);

  nn::GPTConfig cfg;
  cfg.vocab_size = 257;
  cfg.block_size = 32;
  cfg.n_layer = 2;
  cfg.n_head = 4;
  cfg.n_embd = 64;
  cfg.seed = 2024;
  nn::GPT model(cfg);
  ckpt::save_safetensors((dir / "init.safetensors").string(), model.state_dict(),
                         {{"n_head", std::to_string(cfg.n_head)}});

  const int64_t S = 20, B = 4, T = 32;
  // Text-like batches: a repeating phrase with noise, so the loss moves a lot in 20 steps.
  Generator gen(77);
  const std::string phrase = "the quick brown fox jumps over the lazy dog. ";
  std::vector<int32_t> in(static_cast<size_t>(S * B * T)), tg(in.size());
  for (int64_t i = 0; i < S * B; ++i) {
    const int64_t start = static_cast<int64_t>(gen.below(phrase.size()));
    for (int64_t t = 0; t <= T; ++t) {
      int32_t tok = static_cast<unsigned char>(phrase[(start + t) % phrase.size()]);
      if (gen.uniform() < 0.1f) tok = static_cast<int32_t>(gen.below(256));
      if (t < T) in[static_cast<size_t>(i * T + t)] = tok;
      if (t > 0) tg[static_cast<size_t>(i * T + t - 1)] = tok;
    }
  }
  tg[5] = -1;  // an ignored target
  Tensor inputs = Tensor::from_vector(in, {S, B, T}), targets = Tensor::from_vector(tg, {S, B, T});
  ckpt::save_safetensors((dir / "batches.safetensors").string(),
                         {{"inputs", inputs}, {"targets", targets}});

  optim::AdamWOptions ao;
  ao.lr = 3e-3f;
  ao.beta1 = 0.9f;
  ao.beta2 = 0.95f;
  ao.eps = 1e-8f;
  auto params = model.named_parameters();
  optim::AdamW opt(optim::decay_groups(params, 0.1f), ao);
  optim::LrSchedule sched;
  sched.lr = 3e-3;
  sched.min_lr = 3e-4;
  sched.warmup_steps = 5;
  sched.total_steps = S;
  sched.decay = optim::LrDecay::cosine;
  std::vector<float> losses;
  for (int64_t s = 0; s < S; ++s) {
    opt.set_lr(static_cast<float>(sched.at(s)));
    opt.zero_grad();
    Tensor x = inputs.slice(s, s + 1).view({B, T}).clone();
    Tensor y = targets.slice(s, s + 1).view({B, T}).clone();
    Tensor loss = model.loss(x, y);
    autograd::backward(loss);
    optim::clip_grad_norm(params, 1.0);
    opt.step();
    losses.push_back(loss.item());
  }

  const std::string cmd = std::string(kPython) + " " + MESHTRAIN_SOURCE_DIR +
                          "/tests/python/parity_reference.py --weights " +
                          (dir / "init.safetensors").string() + " --batches " +
                          (dir / "batches.safetensors").string() +
                          " --lr 3e-3 --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1"
                          " --grad-clip 1.0 --decay cosine --warmup 5 --min-lr 3e-4 --threads 1";
  const std::string out = run(cmd);
  auto j = nlohmann::json::parse(out.substr(out.find('{')));
  auto ref = j["losses"].get<std::vector<double>>();
  ASSERT_EQ(ref.size(), losses.size());
  double max_rel = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double rel = std::fabs(losses[i] - ref[i]) / std::fabs(ref[i]);
    max_rel = std::max(max_rel, rel);
    EXPECT_LE(rel, 1e-4) << "step " << i << ": meshtrain " << losses[i] << " vs torch " << ref[i];
  }
  std::cout << "first loss " << losses.front() << ", last " << losses.back()
            << ", max relative difference to PyTorch " << max_rel << std::endl;
  // The run must actually train, or matching losses would prove little.
  EXPECT_LT(losses.back(), losses.front() - 1.0f);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace meshtrain
