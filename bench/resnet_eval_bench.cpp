// ResNet inference on the CPU (evaluation mode, no gradients): images/s with every conv-BN(-ReLU)
// fused into one oneDNN convolution (nn/conv_bn_relu.h) against the same layers run one by one.
// The model's batch norms get random running statistics and affine parameters, so folding them is
// real work. Each round times one forward of each mode, the order alternating round by round so
// that neither always runs on a warmer cache; images/s = batch / median forward time. One JSON
// line per mode, then one with the ratio of the medians and the median (min-max) of the per-round
// ratios, then a short table. Exits 1 if the two modes disagree on any image's top-1 class.
//
//   resnet_eval_bench [--model small|tiny|resnet18|resnet50] [--batch 64] [--image 28]
//                     [--rounds 30] [--warmup 3] [--threads N]
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/nn/conv_bn_relu.h"
#include "meshtrain/nn/resnet.h"
#include "meshtrain/nn/top1.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/random.h"

namespace {

using namespace meshtrain;
using Clock = std::chrono::steady_clock;

void randomise_batch_norms(const nn::ResNet& model, Generator& gen) {
  for (const auto& [name, bn] : model.batch_norms()) {
    // Handles sharing the layer's storage.
    Tensor mean = bn->running_mean(), var = bn->running_var(), w = bn->weight(), b = bn->bias();
    uniform_(mean, gen, -0.5, 0.5);
    uniform_(var, gen, 0.5, 2.0);
    uniform_(w, gen, 0.5, 1.5);
    uniform_(b, gen, -0.5, 0.5);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain ResNet inference: fused conv-BN-ReLU against the unfused layers"};
  std::string model_name = "small";
  int64_t batch = 64, image = 28, in_channels = 1, classes = 10;
  int rounds = 30, warmup = 3, threads = 0;
  app.add_option("--model", model_name, "small, tiny, resnet18 or resnet50");
  app.add_option("--batch", batch, "images per forward");
  app.add_option("--image", image, "image height and width");
  app.add_option("--channels", in_channels, "input channels");
  app.add_option("--rounds", rounds, "timed forwards per mode");
  app.add_option("--warmup", warmup, "untimed forwards per mode first");
  app.add_option("--threads", threads, "OpenMP threads (default: OMP_NUM_THREADS)");
  CLI11_PARSE(app, argc, argv);
  if (batch <= 0 || image <= 0 || rounds <= 0 || warmup < 0) {
    std::fprintf(stderr, "resnet_eval_bench: --batch, --image and --rounds must be positive\n");
    return 2;
  }
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();

  nn::ResNetConfig config = nn::resnet_config(model_name, in_channels, classes);
  config.seed = 1;
  nn::ResNet model(config);
  Generator gen(2);
  randomise_batch_norms(model, gen);
  model.eval();
  const Tensor x = randn({batch, in_channels, image, image}, gen);
  autograd::NoGradGuard no_grad;

  const nn::ConvBnFusion modes[2] = {nn::ConvBnFusion::automatic, nn::ConvBnFusion::off};
  const char* names[2] = {"fused", "unfused"};
  auto forward = [&](int m) {
    const nn::ScopedConvBnFusion use(modes[m]);
    return model.forward(x);
  };
  // Both modes must agree before their speeds mean anything.
  const std::vector<int32_t> top_fused = nn::top1(forward(0)), top_unfused = nn::top1(forward(1));
  const bool same_top1 = top_fused == top_unfused;
  for (int r = 0; r < warmup; ++r)
    for (int m = 0; m < 2; ++m) forward(m);
  std::vector<double> ms[2];
  for (int r = 0; r < rounds; ++r)
    for (int k = 0; k < 2; ++k) {
      const int m = (r + k) % 2;
      const auto t0 = Clock::now();
      const Tensor logits = forward(m);
      ms[m].push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    }
  double images_per_s[2];
  for (int m = 0; m < 2; ++m) {
    const double med = median(ms[m]);
    images_per_s[m] = static_cast<double>(batch) / (med / 1e3);
    std::cout << nlohmann::json{{"bench", "resnet_eval"},
                                {"mode", names[m]},
                                {"model", model_name},
                                {"batch", batch},
                                {"image", image},
                                {"threads", threads},
                                {"rounds", rounds},
                                {"median_ms", med},
                                {"min_ms", *std::min_element(ms[m].begin(), ms[m].end())},
                                {"max_ms", *std::max_element(ms[m].begin(), ms[m].end())},
                                {"images_per_s", images_per_s[m]}}
                     .dump()
              << std::endl;
  }
  const double speedup = images_per_s[0] / images_per_s[1];
  // The two forwards of a round ran back to back, so their ratio sees the same machine: on a
  // shared one it moves less than the ratio of medians.
  std::vector<double> per_round;
  for (int r = 0; r < rounds; ++r) per_round.push_back(ms[1][r] / ms[0][r]);
  const double round_median = median(per_round);
  const auto [lo, hi] = std::minmax_element(per_round.begin(), per_round.end());
  std::cout << nlohmann::json{{"bench", "resnet_eval"},        {"mode", "ratio"},
                              {"fused_over_unfused", speedup}, {"per_round_median", round_median},
                              {"per_round_min", *lo},          {"per_round_max", *hi},
                              {"same_top1", same_top1}}
                   .dump()
            << std::endl;
  std::printf("\n%s, %d threads, ResNet %s, batch %lld, %lldx%lld images\n",
              cpu::onednn_config().c_str(), threads, model_name.c_str(),
              static_cast<long long>(batch), static_cast<long long>(image),
              static_cast<long long>(image));
  std::printf("%-8s %10s %10s\n", "mode", "median ms", "images/s");
  for (int m = 0; m < 2; ++m)
    std::printf("%-8s %10.2f %10.0f\n", names[m], median(ms[m]), images_per_s[m]);
  std::printf("fused / unfused: %.2fx (per round: %.2fx, %.2f-%.2f); same top-1: %s\n", speedup,
              round_median, *lo, *hi, same_top1 ? "yes" : "no");
  return same_top1 ? 0 : 1;
}
