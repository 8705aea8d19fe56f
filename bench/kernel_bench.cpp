// Times each fused CPU kernel's forward + backward at the shapes of the two reference GPT
// configurations and prints one JSON line per kernel, so that changes to a kernel can be judged
// against the per-layer budget of a training step. Thread count: OMP_NUM_THREADS or --threads.
//
//   kernel_bench [--config a|b|all] [--threads N] [--min-ms 300] [--clock wall|cpu]
//                [--gemm onednn|openblas]
// --gemm picks the library behind the linear layers' products (train.gemm; each row names it).
// --clock cpu measures process CPU time instead of wall time: steadier on a machine shared with
// other work, and equal to wall time at one thread on an idle machine.
//   config a: 4 layers, C=128, NH=4, T=128, B=8;  config b: 6 layers, C=384, NH=6, T=256, B=4.
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <time.h>

#include "meshtrain/tensor/cpu/kernels.h"

namespace {

using namespace meshtrain::cpu;
using Clock = std::chrono::steady_clock;

bool g_cpu_clock = false;

double now_us() {
  if (g_cpu_clock) {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e6 + static_cast<double>(ts.tv_nsec) * 1e-3;
  }
  return std::chrono::duration<double, std::micro>(Clock::now().time_since_epoch()).count();
}

struct Config {
  std::string name;
  int64_t L, B, T, C, NH, V;
};

std::vector<float> filled(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

// Fastest time in microseconds of fn over repeated runs lasting at least min_ms in total. The
// minimum rather than the median: on a shared machine it is the estimate least disturbed by
// other processes.
double time_us(const std::function<void()>& fn, double min_ms) {
  fn();  // warm caches and thread pools
  std::vector<double> runs;
  const auto start = Clock::now();
  while (runs.size() < 5 ||
         std::chrono::duration<double, std::milli>(Clock::now() - start).count() < min_ms) {
    const double t0 = now_us();
    fn();
    runs.push_back(now_us() - t0);
    if (runs.size() >= 10000) break;
  }
  return *std::min_element(runs.begin(), runs.end());
}

struct Row {
  std::string kernel;
  std::string shape;
  int64_t per_step;  // calls per training step (per layer kernels x L)
  double fwd_us;
  double bwd_us;
};

void print(const Config& cfg, int threads, const Row& r) {
  std::printf(
      "{\"config\":\"%s\",\"gemm\":\"%s\",\"threads\":%d,\"kernel\":\"%s\",\"shape\":\"%s\",\"fwd_"
      "us\":%.1f,"
      "\"bwd_us\":%.1f,\"total_us\":%.1f,\"calls_per_step\":%lld,\"per_step_ms\":%.3f}\n",
      cfg.name.c_str(), gemm_backend() == GemmBackend::onednn ? "onednn" : "openblas", threads,
      r.kernel.c_str(), r.shape.c_str(), r.fwd_us, r.bwd_us, r.fwd_us + r.bwd_us,
      static_cast<long long>(r.per_step),
      (r.fwd_us + r.bwd_us) * static_cast<double>(r.per_step) / 1000.0);
  std::fflush(stdout);
}

std::string dims(std::initializer_list<std::pair<const char*, int64_t>> parts) {
  std::string s;
  for (const auto& [k, v] : parts)
    s += (s.empty() ? "" : ",") + std::string(k) + "=" + std::to_string(v);
  return s;
}

void run_config(const Config& cfg, double min_ms) {
  const int threads = omp_get_max_threads();
  const int64_t B = cfg.B, T = cfg.T, C = cfg.C, NH = cfg.NH, V = cfg.V, L = cfg.L;
  const int64_t BT = B * T;
  std::vector<Row> rows;
  double step_ms = 0.0;
  auto report = [&](Row r) {
    print(cfg, threads, r);
    step_ms += (r.fwd_us + r.bwd_us) * static_cast<double>(r.per_step) / 1000.0;
  };

  {  // token + position embedding
    std::vector<int32_t> idx(BT);
    for (int64_t i = 0; i < BT; ++i) idx[i] = static_cast<int32_t>((i * 7919) % V);
    auto wte = filled(V * C, 1), wpe = filled(T * C, 2), out = filled(BT * C, 3);
    auto dwte = filled(V * C, 4), dwpe = filled(T * C, 5);
    report({"embedding", dims({{"B", B}, {"T", T}, {"C", C}, {"V", V}}), 1,
            time_us(
                [&] {
                  gpt_embedding_forward(out.data(), idx.data(), wte.data(), wpe.data(), B, T, C, V);
                },
                min_ms),
            time_us(
                [&] {
                  gpt_embedding_backward(dwte.data(), dwpe.data(), out.data(), idx.data(), B, T, C,
                                         V);
                },
                min_ms)});
  }
  {  // layer norm: two per block plus the final one
    auto x = filled(BT * C, 6), w = filled(C, 7), b = filled(C, 8), out = filled(BT * C, 9);
    std::vector<float> mean(BT), rstd(BT);
    auto dx = filled(BT * C, 10), dw = filled(C, 11), db = filled(C, 12);
    report({"layer_norm", dims({{"N", BT}, {"C", C}}), 2 * L + 1,
            time_us(
                [&] {
                  layer_norm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                                     b.data(), BT, C, 1e-5f);
                },
                min_ms),
            time_us(
                [&] {
                  layer_norm_backward(dx.data(), dw.data(), db.data(), out.data(), x.data(),
                                      w.data(), mean.data(), rstd.data(), BT, C);
                },
                min_ms)});
  }
  // The four Linear layers of a block and the tied LM head.
  const struct {
    const char* name;
    int64_t cin, cout, per_step;
  } linears[] = {{"linear_qkv", C, 3 * C, L},
                 {"linear_attn_proj", C, C, L},
                 {"linear_fc", C, 4 * C, L},
                 {"linear_mlp_proj", 4 * C, C, L},
                 {"linear_lm_head", C, V, 1}};
  for (const auto& lin : linears) {
    auto x = filled(BT * lin.cin, 13), w = filled(lin.cout * lin.cin, 14, 0.1f);
    auto bias = filled(lin.cout, 15), out = filled(BT * lin.cout, 16);
    auto dx = filled(BT * lin.cin, 17), dw = filled(lin.cout * lin.cin, 18),
         db = filled(lin.cout, 19);
    const bool has_bias = std::string(lin.name) != "linear_lm_head";
    report({lin.name, dims({{"BT", BT}, {"C_in", lin.cin}, {"C_out", lin.cout}}), lin.per_step,
            time_us(
                [&] {
                  linear_forward(out.data(), x.data(), w.data(), has_bias ? bias.data() : nullptr,
                                 BT, lin.cin, lin.cout);
                },
                min_ms),
            time_us(
                [&] {
                  linear_backward(dx.data(), dw.data(), has_bias ? db.data() : nullptr, out.data(),
                                  x.data(), w.data(), BT, lin.cin, lin.cout);
                },
                min_ms)});
  }
  {  // attention
    auto qkv = filled(BT * 3 * C, 20), out = filled(BT * C, 21), dqkv = filled(BT * 3 * C, 22);
    std::vector<float> att(B * NH * T * T), scratch(B * NH * T * T);
    report({"attention", dims({{"B", B}, {"T", T}, {"C", C}, {"NH", NH}}), L,
            time_us([&] { attention_forward(out.data(), att.data(), qkv.data(), B, T, C, NH); },
                    min_ms),
            time_us(
                [&] {
                  attention_backward(dqkv.data(), scratch.data(), out.data(), qkv.data(),
                                     att.data(), B, T, C, NH);
                },
                min_ms)});
  }
  {  // GELU on the MLP hidden layer
    const int64_t n = BT * 4 * C;
    auto x = filled(n, 23, 3.0f), out = filled(n, 24), dx = filled(n, 25);
    report({"gelu", dims({{"n", n}}), L,
            time_us([&] { gelu_forward(out.data(), x.data(), n); }, min_ms),
            time_us([&] { gelu_backward(dx.data(), x.data(), out.data(), n); }, min_ms)});
  }
  {  // residual adds: two per block
    const int64_t n = BT * C;
    auto a = filled(n, 26), b = filled(n, 27), out = filled(n, 28), da = filled(n, 29),
         db = filled(n, 30);
    report({"residual", dims({{"n", n}}), 2 * L,
            time_us([&] { residual_forward(out.data(), a.data(), b.data(), n); }, min_ms),
            time_us([&] { residual_backward(da.data(), db.data(), out.data(), n); }, min_ms)});
  }
  {  // loss
    auto logits = filled(BT * V, 31, 4.0f), dlogits = filled(BT * V, 32);
    std::vector<float> losses(BT), lse(BT);
    std::vector<int32_t> targets(BT);
    for (int64_t i = 0; i < BT; ++i) targets[i] = static_cast<int32_t>((i * 31) % V);
    report({"cross_entropy", dims({{"N", BT}, {"V", V}}), 1,
            time_us(
                [&] {
                  cross_entropy_forward(losses.data(), lse.data(), logits.data(), targets.data(),
                                        BT, V);
                },
                min_ms),
            time_us(
                [&] {
                  cross_entropy_backward(dlogits.data(), logits.data(), lse.data(), targets.data(),
                                         1.0f, BT, V);
                },
                min_ms)});
  }
  {  // optimizer over every parameter (tied embeddings): reported as the "forward" column
    const int64_t n = V * C + T * C + L * (12 * C * C + 13 * C) + 2 * C;
    auto p = filled(n, 33), g = filled(n, 34), m = filled(n, 35), v = filled(n, 36, 0.5f);
    for (auto& x : v) x = x * x;
    int64_t t = 1;
    report({"adamw", dims({{"n", n}}), 1,
            time_us(
                [&] {
                  adamw_step(p.data(), g.data(), m.data(), v.data(), n, 1e-3f, 0.9f, 0.95f, 1e-8f,
                             0.1f, t++);
                },
                min_ms),
            0.0});
  }
  std::printf(
      "{\"config\":\"%s\",\"threads\":%d,\"kernel\":\"step_estimate\",\"per_step_ms\":%.3f,"
      "\"tokens_per_s\":%.0f}\n",
      cfg.name.c_str(), threads, step_ms, static_cast<double>(BT) / (step_ms / 1000.0));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times the fused CPU kernels at the reference GPT shapes"};
  std::string which = "all";
  int threads = 0;
  double min_ms = 300.0;
  int64_t vocab = 257;
  app.add_option("--config", which, "a, b or all")->check(CLI::IsMember({"a", "b", "all"}));
  app.add_option("--threads", threads, "OpenMP threads (default: OMP_NUM_THREADS)");
  app.add_option("--min-ms", min_ms, "minimum measuring time per kernel and direction");
  app.add_option("--vocab", vocab, "vocabulary size V");
  std::string clock = "wall";
  app.add_option("--clock", clock, "wall or cpu (process CPU time)")
      ->check(CLI::IsMember({"wall", "cpu"}));
  std::string gemm = "onednn";
  app.add_option("--gemm", gemm, "library of the matrix products: onednn or openblas")
      ->check(CLI::IsMember({"onednn", "openblas"}));
  CLI11_PARSE(app, argc, argv);
  set_gemm_backend(gemm == "onednn" ? GemmBackend::onednn : GemmBackend::openblas);
  if (threads > 0) omp_set_num_threads(threads);
  g_cpu_clock = clock == "cpu";
  const Config configs[] = {{"a", 4, 8, 128, 128, 4, vocab}, {"b", 6, 4, 256, 384, 6, vocab}};
  for (const auto& cfg : configs) {
    if (which == "all" || which == cfg.name) run_config(cfg, min_ms);
  }
  return 0;
}
