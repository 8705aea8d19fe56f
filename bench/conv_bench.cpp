// Times the convolution kernels, forward + backward (data and weights), at the shapes of a ResNet
// (18/34 basic blocks: the stem, a 3x3 of each stage, the strided 3x3 and the 1x1 downsample that
// open a stage) with oneDNN and with the reference, and PyTorch's conv2d on the same shapes in the
// same invocation (Debian's python3-torch, which convolves through oneDNN too). Prints one JSON
// line per shape and implementation, then a table with the ratio PyTorch time / oneDNN time
// (above 1: ours is faster). Thread count: OMP_NUM_THREADS or --threads; PyTorch gets the same.
//
//   conv_bench [--batch 8] [--image 128] [--threads N] [--min-ms 200] [--no-reference]
//              [--no-torch] [--python /usr/bin/python3]
// --image is the network's input size, a multiple of 32 (224 for ImageNet; 128 keeps a run short
// on a few cores).
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/command_output.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/cpu/gemm.h"

namespace {

using meshtrain::cpu::Conv2dShape;
using meshtrain::cpu::ConvImpl;
using Clock = std::chrono::steady_clock;

struct Layer {
  std::string name;
  Conv2dShape s;
};

Conv2dShape conv(int64_t N, int64_t C_in, int64_t H, int64_t C_out, int64_t K, int64_t stride,
                 int64_t pad) {
  Conv2dShape s;
  s.N = N;
  s.C_in = C_in;
  s.H = s.W = H;
  s.C_out = C_out;
  s.KH = s.KW = K;
  s.stride_h = s.stride_w = stride;
  s.pad_h = s.pad_w = pad;
  return s;
}

std::vector<Layer> resnet_layers(int64_t N, int64_t image) {
  const int64_t s4 = image / 4, s8 = image / 8, s16 = image / 16, s32 = image / 32;
  return {
      {"stem_7x7s2_3to64", conv(N, 3, image, 64, 7, 2, 3)},
      {"layer1_3x3_64", conv(N, 64, s4, 64, 3, 1, 1)},
      {"layer2_3x3s2_64to128", conv(N, 64, s4, 128, 3, 2, 1)},
      {"layer2_1x1s2_64to128", conv(N, 64, s4, 128, 1, 2, 0)},
      {"layer2_3x3_128", conv(N, 128, s8, 128, 3, 1, 1)},
      {"layer3_3x3_256", conv(N, 256, s16, 256, 3, 1, 1)},
      {"layer4_3x3_512", conv(N, 512, s32, 512, 3, 1, 1)},
  };
}

std::vector<float> filled(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return v;
}

double elapsed_us(const std::function<void()>& fn) {
  const auto t0 = Clock::now();
  fn();
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
}

// Fastest time in microseconds over repeated runs lasting at least min_ms (and at least 3 runs):
// on a shared machine the minimum is the estimate least disturbed by other processes. first_us
// (may be nullptr) gets the first call's time, which includes creating oneDNN's primitive.
double time_us(const std::function<void()>& fn, double min_ms, double* first_us = nullptr) {
  const double first = elapsed_us(fn);  // also warms caches and thread pools
  if (first_us != nullptr) *first_us = first;
  std::vector<double> runs;
  const auto start = Clock::now();
  while (runs.size() < 3 ||
         std::chrono::duration<double, std::milli>(Clock::now() - start).count() < min_ms) {
    runs.push_back(elapsed_us(fn));
    if (runs.size() >= 1000) break;
  }
  return *std::min_element(runs.begin(), runs.end());
}

struct Times {
  double fwd_us = 0, bwd_data_us = 0, bwd_weights_us = 0;
  double first_fwd_us = 0;  // the first forward call, primitive creation included
  double total() const { return fwd_us + bwd_data_us + bwd_weights_us; }
};

Times time_layer(const Conv2dShape& s, ConvImpl impl, double min_ms) {
  const int64_t Cg = s.C_in / s.groups;
  auto x = filled(s.N * s.C_in * s.H * s.W, 1), w = filled(s.C_out * Cg * s.KH * s.KW, 2);
  auto dy = filled(s.N * s.C_out * s.out_h() * s.out_w(), 3);
  std::vector<float> y(dy.size()), dx(x.size()), dw(w.size());
  Times t;
  t.fwd_us = time_us(
      [&] { meshtrain::cpu::conv2d_forward(y.data(), x.data(), w.data(), nullptr, s, impl); },
      min_ms, &t.first_fwd_us);
  t.bwd_data_us = time_us(
      [&] { meshtrain::cpu::conv2d_backward_data(dx.data(), dy.data(), w.data(), s, impl); },
      min_ms);
  t.bwd_weights_us = time_us(
      [&] {
        meshtrain::cpu::conv2d_backward_weights(dw.data(), nullptr, dy.data(), x.data(), s, impl);
      },
      min_ms);
  return t;
}

// Multiply-adds of the forward; the backward does twice as many.
double gflop_fwd_bwd(const Conv2dShape& s) {
  const double macs = static_cast<double>(s.N * s.C_out * s.out_h() * s.out_w()) *
                      static_cast<double>(s.C_in / s.groups * s.KH * s.KW);
  return 2.0 * 3.0 * macs / 1e9;
}

// Runs the PyTorch side once for every layer; returns its JSON lines keyed by layer name.
std::map<std::string, nlohmann::json> run_torch(const std::string& python,
                                                const std::string& script,
                                                const std::vector<Layer>& layers, int threads,
                                                double min_ms) {
  nlohmann::json spec = nlohmann::json::array();
  for (const Layer& l : layers)
    spec.push_back({{"name", l.name},
                    {"N", l.s.N},
                    {"C_in", l.s.C_in},
                    {"H", l.s.H},
                    {"W", l.s.W},
                    {"C_out", l.s.C_out},
                    {"K", l.s.KH},
                    {"stride", l.s.stride_h},
                    {"pad", l.s.pad_h},
                    {"dil", l.s.dil_h},
                    {"groups", l.s.groups}});
  std::ostringstream cmd;
  cmd << python << " " << script << " --threads " << threads << " --min-ms " << min_ms
      << " --layers '" << spec.dump() << "' 2>/dev/null";
  std::map<std::string, nlohmann::json> out;
  const meshtrain::bench::CommandOutput run = meshtrain::bench::run_command(cmd.str());
  if (!run.started || run.status != 0) return out;
  const std::string& text = run.text;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_object() && j.contains("name")) out[j["name"].get<std::string>()] = j;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain convolution kernels (oneDNN, reference) against PyTorch's conv2d"};
  int64_t batch = 8, image = 128;
  int threads = 0;
  double min_ms = 200;
  bool no_reference = false, no_torch = false;
  std::string python = "/usr/bin/python3";
  std::string script = std::string(MESHTRAIN_SOURCE_DIR) + "/bench/python/conv_bench_torch.py";
  app.add_option("--batch", batch, "images per batch");
  app.add_option("--image", image, "input image size (a multiple of 32)");
  app.add_option("--threads", threads, "OpenMP threads (default: OMP_NUM_THREADS)");
  app.add_option("--min-ms", min_ms, "minimum timing per measurement");
  app.add_flag("--no-reference", no_reference, "skip the reference implementation");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch side");
  app.add_option("--python", python, "Python interpreter with torch");
  app.add_option("--torch-script", script, "PyTorch side of the benchmark");
  CLI11_PARSE(app, argc, argv);
  if (image % 32 != 0 || image <= 0 || batch <= 0) {
    std::fprintf(stderr,
                 "conv_bench: --image must be a positive multiple of 32, --batch positive\n");
    return 2;
  }
  if (threads > 0) omp_set_num_threads(threads);
  threads = omp_get_max_threads();

  const std::vector<Layer> layers = resnet_layers(batch, image);
  struct Row {
    std::string name;
    double gflop;
    Times onednn, reference;
    double torch_fwd = 0, torch_bwd = 0;
  };
  std::vector<Row> rows;
  for (const Layer& l : layers) {
    Row r{l.name, gflop_fwd_bwd(l.s), time_layer(l.s, ConvImpl::onednn, min_ms), {}, 0, 0};
    if (!no_reference) r.reference = time_layer(l.s, ConvImpl::reference, min_ms);
    for (const auto& [impl, t] :
         {std::pair{"onednn", r.onednn}, std::pair{"reference", r.reference}}) {
      if (t.total() == 0) continue;
      std::cout << nlohmann::json{{"layer", l.name},
                                  {"impl", impl},
                                  {"shape", l.s.str()},
                                  {"threads", threads},
                                  {"fwd_us", t.fwd_us},
                                  {"bwd_data_us", t.bwd_data_us},
                                  {"bwd_weights_us", t.bwd_weights_us},
                                  {"total_us", t.total()},
                                  {"first_fwd_us", t.first_fwd_us},
                                  {"gflops", r.gflop / (t.total() * 1e-6)}}
                       .dump()
                << std::endl;
    }
    rows.push_back(r);
  }
  std::string torch_info = "not run";
  if (!no_torch) {
    const auto torch = run_torch(python, script, layers, threads, min_ms);
    torch_info = torch.empty() ? "unavailable" : "";
    for (Row& r : rows) {
      auto it = torch.find(r.name);
      if (it == torch.end()) continue;
      r.torch_fwd = it->second["fwd_us"].get<double>();
      r.torch_bwd = it->second["bwd_us"].get<double>();
      if (torch_info.empty()) torch_info = it->second.value("torch", std::string("?"));
      nlohmann::json j = it->second;
      j["layer"] = r.name;
      j["impl"] = "pytorch";
      j["threads"] = threads;
      j["total_us"] = r.torch_fwd + r.torch_bwd;
      j["ratio_pytorch_over_onednn"] = (r.torch_fwd + r.torch_bwd) / r.onednn.total();
      std::cout << j.dump() << std::endl;
    }
  }

  std::printf("\n%s, %s, %d threads, batch %lld, image %lld; PyTorch: %s\n",
              meshtrain::cpu::onednn_config().c_str(), meshtrain::cpu::blas_config().c_str(),
              threads, static_cast<long long>(batch), static_cast<long long>(image),
              torch_info.c_str());
  std::printf("%-22s %8s %11s %11s %11s %9s %9s\n", "layer (fwd+bwd)", "GFLOP", "onednn ms",
              "reference", "pytorch ms", "ref/dnnl", "pt/dnnl");
  for (const Row& r : rows) {
    const double d = r.onednn.total() / 1e3, ref = r.reference.total() / 1e3,
                 pt = (r.torch_fwd + r.torch_bwd) / 1e3;
    std::printf("%-22s %8.3f %11.2f %11.2f %11.2f %9.2f %9.2f\n", r.name.c_str(), r.gflop, d, ref,
                pt, ref > 0 ? ref / d : 0.0, pt > 0 ? pt / d : 0.0);
  }
  return 0;
}
