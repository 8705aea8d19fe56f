// GPT training throughput on one CUDA device, side by side with the same model in PyTorch
// (eager and torch.compile, f32 like meshtrain, then bf16 autocast with flash attention and fused
// AdamW: PyTorch at its best) on the same GPU. One command on a GPU machine:
//
//   build-cuda/gpu_train_bench --config gpt2
//
// meshtrain trains the model in f32 (TF32 products unless --tf32 0) and under bf16 autocast (bf16
// GEMMs with f32 accumulation, flash attention; --precision picks one or both) for --warmup +
// --steps steps on random tokens (forward, loss,
// backward, global-norm clipping, AdamW) through the training engine as the trainer takes them
// (--loop direct: a loop of the bench's own over the model and AdamW), timing each step from its
// first kernel to the end of the device work (the loss is read back every step, as the PyTorch
// side does). Reported: median
// tokens/s, MFU and the peak memory of the caching allocator; then bench/python/
// gpu_train_bench_torch.py runs the same configuration, or the line says why it was skipped.
//
// MFU = tokens/s * FLOPs per token / peak FLOP/s, with FLOPs per token from
// GPTConfig::flops_per_token: 6 * N + 6 * L * T * C, where N = 12 * L * C^2 + V * C counts the
// parameters of the matrix products (the tied output projection included, embeddings and
// LayerNorms excluded) and 6 * L * T * C is causal attention's two T x T products, forward and
// backward. The peak defaults to the H100's dense bf16 figure (989 TFLOP/s) although these runs are
// f32/TF32: the MFU says how far a run is from what the hardware can do with the fast format.
//
// Output: JSON lines (one per measurement, then one summary), then a table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/command_output.h"
#include "bench/lib/torch_peer.h"
#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/batch_uploader.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/tensor/random.h"

#if MESHTRAIN_HAVE_CUDA
#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernel_profiler.h"
#include "meshtrain/cuda/kernels/flash_attention.h"
#include "meshtrain/cuda/kernels/gemm.h"
#include "meshtrain/tensor/device_kernels.h"
#endif

using namespace meshtrain;

namespace {

struct BenchConfig {
  std::string name;
  int64_t n_layer, n_embd, n_head, block_size, batch_size, vocab_size;
};

const std::map<std::string, BenchConfig>& known_configs() {
  static const std::map<std::string, BenchConfig> k = {
      // GPT-2 small (124M) with the vocabulary padded to a multiple of 64, as llm.c and nanoGPT do.
      {"gpt2", {"gpt2", 12, 768, 12, 1024, 8, 50304}},
      // The demo's model: a smoke test that runs in seconds.
      {"tiny", {"tiny", 4, 128, 4, 128, 8, 257}},
  };
  return k;
}

nn::GPTConfig gpt_config(const BenchConfig& c) {
  nn::GPTConfig g;
  g.n_layer = c.n_layer;
  g.n_embd = c.n_embd;
  g.n_head = c.n_head;
  g.block_size = c.block_size;
  g.vocab_size = c.vocab_size;
  return g;
}

#if MESHTRAIN_HAVE_CUDA
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

struct Measurement {
  double tokens_per_s = 0;
  double step_ms = 0;
  double peak_allocated_gib = 0;
  double peak_reserved_gib = 0;
  float final_loss = 0;
};

// Under bf16 autocast when `precision` is bf16 (half GEMMs, flash attention); with `profile`,
// one more step after the timed ones goes through a KernelProfiler and its per-op times are
// printed as JSON lines.
// `engine`: the step as the trainer takes it (parallel::TrainEngine: the norm, the skip decision
// and the clipping decided on the device, one read a step); otherwise a loop over the model and
// the optimizer of its own, which reads the norm before the update (the engine's step before
// 2026-11-28), to tell the engine's host part from the kernels'.
Measurement run_meshtrain(const BenchConfig& c, int steps, int warmup, DType precision,
                          bool profile, bool engine_loop) {
  const Device dev = Device::cuda(0);
  constexpr float kLr = 6e-4f;
  optim::AdamWOptions ao;
  ao.lr = kLr;
  ao.beta2 = 0.95f;
  ao.weight_decay = 0.1f;
  std::unique_ptr<parallel::TrainEngine> engine;
  std::unique_ptr<nn::GPT> model;
  std::unique_ptr<optim::AdamW> opt;
  nn::NamedTensors params;
  if (engine_loop) {
    parallel::EngineOptions o;
    o.adamw = ao;
    o.weight_decay = ao.weight_decay;
    o.precision = precision;
    parallel::EngineSpec spec;
    spec.model = std::make_shared<models::GptSource>(gpt_config(c));
    spec.mesh = parallel::data_parallel_mesh(nullptr);
    spec.device = dev;
    spec.options = o;
    engine = parallel::make_engine(std::move(spec));
  } else {
    model = std::make_unique<nn::GPT>(gpt_config(c));
    model->to(dev);
    params = model->named_parameters();
    opt = std::make_unique<optim::AdamW>(optim::decay_groups(params, ao.weight_decay), ao);
  }
  cuda::BatchUploader uploader(dev);
  Generator gen(1);
  const int64_t B = c.batch_size, T = c.block_size;
  std::vector<int32_t> tokens(static_cast<size_t>(B * (T + 1)));
  std::vector<double> step_s;
  Measurement m;
  cuda::synchronize_device(0);
  std::unique_ptr<cuda::KernelProfiler> profiler;
  for (int s = 0; s < warmup + steps + (profile ? 1 : 0); ++s) {
    if (s == warmup + steps) {
      profiler = std::make_unique<cuda::KernelProfiler>(device_kernels(dev, "profile"));
      set_device_kernels(DeviceType::cuda, profiler.get());
    }
    for (auto& t : tokens) t = static_cast<int32_t>(gen.below(static_cast<uint64_t>(c.vocab_size)));
    std::vector<int32_t> x, y;
    for (int64_t b = 0; b < B; ++b) {
      auto row = tokens.begin() + b * (T + 1);
      x.insert(x.end(), row, row + T);
      y.insert(y.end(), row + 1, row + T + 1);
    }
    const auto t0 = std::chrono::steady_clock::now();
    Tensor idx = uploader.upload(Tensor::from_vector(x, {B, T}));
    Tensor tgt = uploader.upload(Tensor::from_vector(y, {B, T}));
    if (engine) {
      parallel::StepOptions so;
      so.step = s + 1;
      so.lr = kLr;
      so.grad_clip = 1.0;
      m.final_loss = engine->train_step({{idx, tgt}}, so).loss;
    } else {
      opt->zero_grad();
      Tensor loss;
      {
        autograd::AutocastGuard autocast(precision);
        loss = model->loss(idx, tgt);
        autograd::backward(loss);
      }
      // Clipped as the trainer clips: the coefficient applied where AdamW reads the gradients.
      opt->step(optim::clip_coefficient(std::sqrt(optim::grad_norm_squared(params)), 1.0));
      m.final_loss = loss.item();
    }
    cuda::synchronize_device(0);
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup && s < warmup + steps) step_s.push_back(dt);
    if (profiler) {
      set_device_kernels(DeviceType::cuda, nullptr);
      double total = 0;
      for (const cuda::OpTime& t : profiler->report()) {
        total += t.ms;
        std::cout << nlohmann::json{{"profile", dtype_name(precision)},
                                    {"op", t.op},
                                    {"calls", t.calls},
                                    {"ms", t.ms}}
                         .dump()
                  << std::endl;
      }
      std::cout << nlohmann::json{{"profile", dtype_name(precision)},
                                  {"op", "(step, host-timed)"},
                                  {"ms", dt * 1e3},
                                  {"table_ms", total}}
                       .dump()
                << std::endl;
    }
  }
  const double med = median(step_s);
  m.step_ms = med * 1e3;
  m.tokens_per_s = static_cast<double>(B * T) / med;
  const cuda::AllocatorStats st = cuda::CachingAllocator::for_device(0).stats();
  m.peak_allocated_gib = static_cast<double>(st.peak_allocated_bytes) / (1u << 30);
  m.peak_reserved_gib = static_cast<double>(st.peak_reserved_bytes) / (1u << 30);
  return m;
}

#endif

// Runs the PyTorch script once with one interpreter; returns its last JSON line, or
// {"skipped": why}.
// With `profile`, the script's kernel lines ({"profile": ...}) are printed as they come, labelled
// with `label`; the result is its last JSON line.
nlohmann::json run_torch_with(const std::string& python, const std::string& script,
                              const BenchConfig& c, const std::string& mode, bool tf32, int steps,
                              int warmup, int timeout_s, bool profile, const std::string& label) {
  std::ostringstream cmd;
  cmd << "timeout " << timeout_s << " " << python << " " << script << " --n-layer " << c.n_layer
      << " --n-embd " << c.n_embd << " --n-head " << c.n_head << " --block-size " << c.block_size
      << " --batch-size " << c.batch_size << " --vocab-size " << c.vocab_size << " --steps "
      << steps << " --warmup " << warmup << " --mode " << mode << " --tf32 " << (tf32 ? 1 : 0)
      << (profile ? " --profile 1" : "") << " 2>&1";
  const bench::CommandOutput run = bench::run_command(cmd.str());
  if (!run.started) return {{"skipped", "cannot start " + python}};
  const std::string& out = run.text;
  const int status = run.status;
  std::istringstream lines(out);
  std::string line, last, tail;
  while (std::getline(lines, line)) {
    if (line.rfind("{\"profile\"", 0) == 0) {
      nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object()) {
        j["profile"] = label;
        std::cout << j.dump() << std::endl;
      }
      continue;
    }
    if (!line.empty() && line[0] == '{') last = line;
    if (!line.empty()) tail = line;
  }
  if (!last.empty()) {
    nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
    if (j.is_object()) return j;
  }
  return {{"skipped",
           "the PyTorch script failed (exit status " + std::to_string(status) + "): " + tail}};
}

nlohmann::json run_torch(const bench::TorchPeer& peer, const BenchConfig& c,
                         const std::string& mode, bool tf32, int steps, int warmup, bool profile,
                         const std::string& label) {
  return peer.run(
      [&](const std::string& python) {
        return run_torch_with(python, peer.script, c, mode, tf32, steps, warmup, peer.timeout_s,
                              profile, label);
      },
      [](const nlohmann::json& j) {
        return j.value("skipped", std::string()).find("not importable") != std::string::npos;
      });
}

std::string default_torch_script() {
  return bench::source_file(std::filesystem::path("bench") / "python" / "gpu_train_bench_torch.py",
                            MESHTRAIN_SOURCE_DIR);
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain GPT training throughput on a CUDA device, against PyTorch"};
  std::string config = "gpt2";
  int steps = 20, warmup = 5;
  int64_t batch_size = 0;
  bool tf32 = true, no_compile = false;
  double peak_tflops = 989.0;
  bench::TorchPeer torch_peer;
  torch_peer.script = default_torch_script();
  torch_peer.timeout_s = 1200;
  app.add_option("--config", config, "gpt2 (124M: 12L, C768, 12H, T1024, V50304, B8) or tiny");
  app.add_option("--batch-size", batch_size, "sequences per step (0 = the config's)");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps before timing");
  app.add_option("--tf32", tf32, "f32 matrix products on TF32 tensor cores, both sides (1/0)");
  app.add_option("--peak-tflops", peak_tflops, "peak TFLOP/s for MFU (H100 dense bf16: 989)");
  torch_peer.add_options(app, "per PyTorch run");
  app.add_flag("--no-compile", no_compile, "skip the torch.compile run");
  bool torch_best_only = false;
  app.add_flag("--torch-best-only", torch_best_only,
               "run only PyTorch at its best (compile, bf16 autocast, flash attention, fused "
               "AdamW), not its f32 runs");
  std::string precision = "both";
  bool profile = false;
  app.add_option("--precision", precision,
                 "meshtrain's precision: f32 (TF32 products per --tf32), bf16 (autocast: bf16 "
                 "GEMMs, flash attention) or both")
      ->check(CLI::IsMember({"f32", "bf16", "both"}));
  app.add_flag("--profile", profile,
               "after the timed steps, one step with each device op timed (JSON lines "
               "{\"profile\": ...}), and PyTorch at its best's device kernels the same way");
  std::string epilogues = "on";
  app.add_option("--fused-epilogues", epilogues,
                 "bias gradients and GELU in the products' epilogues (on), from separate kernels "
                 "(off, the impl named ...-separate), or both, one after the other")
      ->check(CLI::IsMember({"on", "off", "both"}));
  std::string atomic_dq = "off";
  app.add_option("--atomic-dq", atomic_dq,
                 "flash attention's backward with dq summed by atomics in the key-side pass (on, "
                 "the impl named ...-atomic-dq; not deterministic), with its dq kernel (off), or "
                 "both")
      ->check(CLI::IsMember({"on", "off", "both"}));
  std::string loop = "engine";
  app.add_option("--loop", loop,
                 "meshtrain's step: the training engine's, as the trainer takes it (engine), or "
                 "the model and AdamW in a loop of the bench's own that reads the gradient norm "
                 "before the update (direct, the impl named ...-direct), or both")
      ->check(CLI::IsMember({"engine", "direct", "both"}));
  CLI11_PARSE(app, argc, argv);

  // The variants of meshtrain's step to time: the defaults first, then each switch flipped.
  struct Variant {
    bool fused, atomic_dq, engine;
    std::string suffix;
  };
  std::vector<Variant> variants;
  const bool fused_default = epilogues != "off", atomic_default = atomic_dq == "on";
  const bool engine_default = loop != "direct";
  variants.push_back({fused_default, atomic_default, engine_default,
                      std::string(fused_default ? "" : "-separate") +
                          (atomic_default ? "-atomic-dq" : "") + (engine_default ? "" : "-direct")});
  if (epilogues == "both") variants.push_back({false, atomic_default, engine_default, "-separate"});
  if (atomic_dq == "both") variants.push_back({fused_default, true, engine_default, "-atomic-dq"});
  if (loop == "both") variants.push_back({fused_default, atomic_default, false, "-direct"});
  std::vector<DType> precisions;
  if (precision != "bf16") precisions.push_back(DType::f32);
  if (precision != "f32") precisions.push_back(DType::bf16);
  auto it = known_configs().find(config);
  if (it == known_configs().end()) {
    std::cerr << "gpu_train_bench: unknown configuration '" << config
              << "' (expected gpt2 or tiny)\n";
    return 2;
  }
  BenchConfig c = it->second;
  if (batch_size > 0) c.batch_size = batch_size;
  const double flops_per_token = gpt_config(c).flops_per_token(c.block_size);
  const double peak = peak_tflops * 1e12;
  auto mfu = [&](double tok_s) { return tok_s * flops_per_token / peak; };
  const nlohmann::json cfg = {{"name", c.name},
                              {"n_layer", c.n_layer},
                              {"n_embd", c.n_embd},
                              {"n_head", c.n_head},
                              {"block_size", c.block_size},
                              {"batch_size", c.batch_size},
                              {"vocab_size", c.vocab_size}};

  if (cuda::device_count() == 0) {
    std::cout << nlohmann::json{{"impl", "meshtrain"},
                                {"skipped", cuda::unavailable_reason()},
                                {"config", cfg}}
                     .dump()
              << std::endl;
    std::cout << "gpu_train_bench: skipped: " << cuda::unavailable_reason() << std::endl;
    if (!torch_peer.skip) {
      // PyTorch says for itself whether it could have run here.
      nlohmann::json j =
          run_torch(torch_peer, c, "eager", tf32, steps, warmup, false, "pytorch-eager");
      j["impl"] = "pytorch-eager";
      std::cout << j.dump() << std::endl;
    }
    return 0;
  }
#if MESHTRAIN_HAVE_CUDA
  cuda::use_device(0);
  cuda::set_allow_tf32(tf32);
  const std::string device_name = cuda::device_properties(0).str();
  // meshtrain in each precision and variant asked for; `m` is the fastest precision in the default
  // variant, the one the ratios use.
  struct Row {
    std::string impl;
    double tok_s = 0, step_ms = 0, mem_gib = 0;
    std::string note;
  };
  std::vector<Row> rows;
  Measurement m;
  for (const DType p : precisions) {
    for (const Variant& v : variants) {
      const std::string impl = "meshtrain-" + std::string(dtype_name(p)) + v.suffix;
      Measurement mp;
      try {
        cuda::set_fused_epilogues(v.fused);
        cuda::set_flash_backward_atomic_dq(v.atomic_dq);
        cuda::CachingAllocator::for_device(0).reset_peaks();
        mp = run_meshtrain(c, steps, warmup, p, profile, v.engine);
      } catch (const std::exception& e) {
        // Reported, and the rest still runs: their figures are worth having on their own.
        std::cout << nlohmann::json{{"impl", impl}, {"config", cfg}, {"error", e.what()}}.dump()
                  << std::endl;
      }
      // The next run needs the memory this one cached (unless the device failed for good).
      try {
        cuda::CachingAllocator::for_device(0).empty_cache();
      } catch (const std::exception& e) {
        std::cerr << "gpu_train_bench: " << e.what() << std::endl;
      }
      if (mp.tokens_per_s > 0)
        std::cout << nlohmann::json{{"impl", impl},
                                    {"device", device_name},
                                    {"config", cfg},
                                    {"precision", dtype_name(p)},
                                    {"tf32", tf32},
                                    {"steps", steps},
                                    {"warmup", warmup},
                                    {"step_ms_median", mp.step_ms},
                                    {"tokens_per_s", mp.tokens_per_s},
                                    {"flops_per_token", flops_per_token},
                                    {"mfu", mfu(mp.tokens_per_s)},
                                    {"peak_tflops", peak_tflops},
                                    {"peak_allocated_gib", mp.peak_allocated_gib},
                                    {"peak_reserved_gib", mp.peak_reserved_gib},
                                    {"final_loss", mp.final_loss},
                                    {"fused_epilogues", v.fused},
                                    {"atomic_dq", v.atomic_dq},
                                    {"loop", v.engine ? "engine" : "direct"},
                                    // The fused forms cuBLASLt had no kernel for, so far.
                                    {"separate_epilogues", cuda::epilogue_fallbacks()},
                                    {"flash_forward_tuning", cuda::flash_forward_tuning()}}
                         .dump()
                  << std::endl;
      rows.push_back({impl, mp.tokens_per_s, mp.step_ms, mp.peak_allocated_gib,
                      "failed: see its error line above"});
      // The ratios are the defaults' (the other variants are rows of their own).
      if (&v == &variants.front() && mp.tokens_per_s > m.tokens_per_s) m = mp;
    }
  }
  cuda::set_fused_epilogues(true);
  cuda::set_flash_backward_atomic_dq(false);

  // The same f32 model as meshtrain (eager, compiled), then PyTorch as its users run it at its
  // best: bf16 autocast, flash attention through scaled_dot_product_attention, fused AdamW.
  std::vector<std::pair<std::string, std::string>> modes;  // label, script arguments
  const std::string best = " --precision bf16 --attention sdpa --fused-adamw 1";
  if (!torch_peer.skip) {
    if (!torch_best_only) modes.emplace_back("eager", "eager");
    if (!no_compile && !torch_best_only) modes.emplace_back("compile", "compile");
    if (!no_compile) modes.emplace_back("compile-bf16-flash", "compile" + best);
    if (no_compile) modes.emplace_back("eager-bf16-flash", "eager" + best);
  }
  for (const auto& [label, mode] : modes) {
    // The kernels of PyTorch at its best, beside meshtrain's own profile.
    const bool profile_this = profile && mode.find(best) != std::string::npos;
    nlohmann::json j =
        run_torch(torch_peer, c, mode, tf32, steps, warmup, profile_this, "pytorch-" + label);
    j["impl"] = "pytorch-" + label;
    if (j.contains("tokens_per_s")) {
      const double tok = j["tokens_per_s"].get<double>();
      j["mfu"] = mfu(tok);
      j["meshtrain_ratio"] = m.tokens_per_s / tok;
      rows.push_back({j["impl"].get<std::string>(), tok, j.value("step_ms_median", 0.0),
                      j.value("peak_allocated_gib", 0.0), ""});
    } else {
      rows.push_back(
          {j["impl"].get<std::string>(), 0, 0, 0, j.value("skipped", std::string("no result"))});
    }
    std::cout << j.dump() << std::endl;
  }
  if (torch_peer.skip) {
    std::cout << nlohmann::json{{"impl", "pytorch"}, {"skipped", "--no-torch"}}.dump() << std::endl;
  }

  std::printf("\n%s, %s, B=%lld T=%lld, f32 runs %s; ratios against the fastest meshtrain run\n",
              device_name.c_str(), c.name.c_str(), static_cast<long long>(c.batch_size),
              static_cast<long long>(c.block_size), tf32 ? "with TF32 products" : "in plain f32");
  std::printf("FLOPs/token = 6*N + 6*L*T*C = %.4g; MFU against %.0f TFLOP/s\n", flops_per_token,
              peak_tflops);
  std::printf("%-18s %14s %10s %8s %12s %10s\n", "impl", "tokens/s", "step ms", "MFU", "peak GiB",
              "mt/this");
  for (const Row& r : rows) {
    if (r.tok_s <= 0) {
      std::printf("%-18s skipped: %s\n", r.impl.c_str(), r.note.c_str());
      continue;
    }
    std::printf("%-18s %14.0f %10.1f %7.1f%% %12.2f %10.2f\n", r.impl.c_str(), r.tok_s, r.step_ms,
                100.0 * mfu(r.tok_s), r.mem_gib, m.tokens_per_s / r.tok_s);
  }
  nlohmann::json summary = {{"summary", true},
                            {"config", c.name},
                            {"meshtrain_tokens_per_s", m.tokens_per_s},
                            {"meshtrain_mfu", mfu(m.tokens_per_s)}};
  for (const Row& r : rows)
    if (r.impl.rfind("meshtrain", 0) != 0 && r.tok_s > 0)
      summary[r.impl + "_ratio"] = m.tokens_per_s / r.tok_s;
  std::cout << summary.dump() << std::endl;
#else
  (void)no_compile;
  (void)mfu;
  (void)profile;
  (void)precisions;
#endif
  return 0;
}
