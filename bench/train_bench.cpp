// Training throughput of meshtrain's GPT on CPU, side by side with the same model in PyTorch.
// Each round runs meshtrain and then PyTorch with the same configuration and thread count, so the
// two see the same machine conditions; the report gives medians over rounds and their ratio.
// Output: one JSON line per measurement, then a table.
#include <cblas.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/command_output.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/random.h"

using namespace meshtrain;

namespace {

struct BenchConfig {
  std::string name;
  int64_t n_layer, n_embd, n_head, block_size, batch_size, vocab_size;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Median tokens/s over `steps` timed steps after `warmup` untimed ones.
double run_meshtrain(const BenchConfig& c, int threads, int steps, int warmup) {
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  nn::GPTConfig gc;
  gc.n_layer = c.n_layer;
  gc.n_embd = c.n_embd;
  gc.n_head = c.n_head;
  gc.block_size = c.block_size;
  gc.vocab_size = c.vocab_size;
  nn::GPT model(gc);
  optim::AdamWOptions ao;
  ao.lr = 3e-4f;
  ao.weight_decay = 0.1f;
  auto params = model.named_parameters();
  optim::AdamW opt(optim::decay_groups(params, ao.weight_decay), ao);
  Generator gen(1);
  std::vector<int32_t> tokens(static_cast<size_t>(c.batch_size * (c.block_size + 1)));
  std::vector<double> step_s;
  for (int s = 0; s < warmup + steps; ++s) {
    for (auto& t : tokens) t = static_cast<int32_t>(gen.below(static_cast<uint64_t>(c.vocab_size)));
    std::vector<int32_t> x, y;
    for (int64_t b = 0; b < c.batch_size; ++b) {
      auto row = tokens.begin() + b * (c.block_size + 1);
      x.insert(x.end(), row, row + c.block_size);
      y.insert(y.end(), row + 1, row + c.block_size + 1);
    }
    const auto t0 = std::chrono::steady_clock::now();
    Tensor idx = Tensor::from_vector(x, {c.batch_size, c.block_size});
    Tensor tgt = Tensor::from_vector(y, {c.batch_size, c.block_size});
    opt.zero_grad();
    Tensor loss = model.loss(idx, tgt);
    autograd::backward(loss);
    // Clipped as the trainer clips: the coefficient applied where AdamW reads the gradients.
    opt.step(optim::clip_coefficient(std::sqrt(optim::grad_norm_squared(params)), 1.0));
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) step_s.push_back(dt);
  }
  return static_cast<double>(c.batch_size * c.block_size) / median(step_s);
}

// Runs the PyTorch script; returns its JSON line (empty when PyTorch is unavailable).
nlohmann::json run_torch(const std::string& python, const std::string& script, const BenchConfig& c,
                         int threads, int steps, int warmup) {
  std::ostringstream cmd;
  cmd << python << " " << script << " --n-layer " << c.n_layer << " --n-embd " << c.n_embd
      << " --n-head " << c.n_head << " --block-size " << c.block_size << " --batch-size "
      << c.batch_size << " --vocab-size " << c.vocab_size << " --steps " << steps << " --warmup "
      << warmup << " --threads " << threads << " 2>/dev/null";
  const bench::CommandOutput run = bench::run_command(cmd.str());
  if (!run.started || run.status != 0) return {};
  nlohmann::json j = bench::last_json_line(run.text);
  return j.is_object() ? j : nlohmann::json{};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain GPT training throughput on CPU, against PyTorch"};
  std::vector<std::string> configs{"a", "b"};
  std::vector<int> threads{1, 2};
  int steps = 20, warmup = 3, rounds = 3;
  std::string python = "/usr/bin/python3";
  std::string script = std::string(MESHTRAIN_SOURCE_DIR) + "/bench/python/train_bench_torch.py";
  bool no_torch = false;
  app.add_option("--configs", configs,
                 "configurations to run: a (4L/128C/4H/T128/B8), b (6L/384C/6H/T256/B4)");
  app.add_option("--threads", threads, "thread counts to run");
  app.add_option("--steps", steps, "timed steps per run");
  app.add_option("--warmup", warmup, "untimed steps before timing");
  app.add_option("--rounds", rounds, "interleaved rounds (meshtrain then PyTorch)");
  app.add_option("--python", python, "Python interpreter with torch");
  app.add_option("--torch-script", script, "PyTorch side of the benchmark");
  app.add_flag("--no-torch", no_torch, "skip the PyTorch side");
  CLI11_PARSE(app, argc, argv);

  const std::map<std::string, BenchConfig> known = {
      {"a", {"a", 4, 128, 4, 128, 8, 257}},
      {"b", {"b", 6, 384, 6, 256, 4, 257}},
  };
  struct Row {
    std::string config;
    int threads;
    double mt, pt;
    std::string blas;
    double round_ratio_median, round_ratio_min, round_ratio_max;
  };
  std::vector<Row> rows;
  for (const auto& name : configs) {
    auto it = known.find(name);
    if (it == known.end()) {
      std::cerr << "train_bench: unknown configuration '" << name << "' (expected a or b)\n";
      return 2;
    }
    for (int th : threads) {
      std::vector<double> mt, pt;
      std::string blas = "?";
      std::vector<double> round_ratios;
      for (int r = 0; r < rounds; ++r) {
        auto run_ours = [&] {
          mt.push_back(run_meshtrain(it->second, th, steps, warmup));
          std::cout << nlohmann::json{{"impl", "meshtrain"},
                                      {"config", name},
                                      {"threads", th},
                                      {"round", r},
                                      {"tokens_per_s", mt.back()},
                                      {"blas", meshtrain::cpu::blas_config()}}
                           .dump()
                    << std::endl;
        };
        auto run_peer = [&] {
          if (no_torch) return false;
          auto j = run_torch(python, script, it->second, th, steps, warmup);
          if (!j.is_object() || !j.contains("tokens_per_s")) return false;
          pt.push_back(j["tokens_per_s"].get<double>());
          if (j.contains("blas")) blas = j["blas"].dump();
          j["round"] = r;
          j["config"] = name;
          std::cout << j.dump() << std::endl;
          return true;
        };
        // Alternate which side goes first, so that a machine that speeds up or slows down over
        // a round favours each side in turn.
        bool peer_ran;
        if (r % 2 == 0) {
          run_ours();
          peer_ran = run_peer();
        } else {
          peer_ran = run_peer();
          run_ours();
        }
        if (peer_ran) round_ratios.push_back(mt.back() / pt.back());
      }
      rows.push_back(
          {name, th, median(mt), median(pt), blas, median(round_ratios),
           round_ratios.empty() ? 0.0 : *std::min_element(round_ratios.begin(), round_ratios.end()),
           round_ratios.empty() ? 0.0
                                : *std::max_element(round_ratios.begin(), round_ratios.end())});
    }
  }
  // "ratio" is the ratio of the medians; the per-round ratios (each round's two runs side by side)
  // show how far the machine moved the comparison.
  std::printf("\nmeshtrain BLAS: %s\n", meshtrain::cpu::blas_config().c_str());
  std::printf("%-7s %-8s %16s %16s %8s %22s  %s\n", "config", "threads", "meshtrain tok/s",
              "pytorch tok/s", "ratio", "per round: med (min-max)", "pytorch blas");
  for (const Row& r : rows) {
    std::printf("%-7s %-8d %16.0f %16.0f %8.2f %10.2f (%.2f-%.2f)  %s\n", r.config.c_str(),
                r.threads, r.mt, r.pt, r.pt > 0 ? r.mt / r.pt : 0.0, r.round_ratio_median,
                r.round_ratio_min, r.round_ratio_max, r.blas.c_str());
    std::cout << nlohmann::json{{"summary", true},
                                {"config", r.config},
                                {"threads", r.threads},
                                {"meshtrain_tokens_per_s", r.mt},
                                {"pytorch_tokens_per_s", r.pt},
                                {"ratio", r.pt > 0 ? r.mt / r.pt : 0.0},
                                {"round_ratio_median", r.round_ratio_median},
                                {"round_ratio_min", r.round_ratio_min},
                                {"round_ratio_max", r.round_ratio_max}}
                     .dump()
              << std::endl;
  }
  return 0;
}
