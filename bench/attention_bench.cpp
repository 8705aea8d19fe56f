// Flash attention's kernels alone on one CUDA device, side by side with PyTorch's
// scaled_dot_product_attention on its flash backend, at the shapes of the models we train: the
// kernel-level figure behind gpu_train_bench's step, to judge a change to the kernels in minutes.
//
//   attention_bench [--shapes gpt2,gpt2-4k,d128,d32 | all] [--iters 20] [--warmup 5]
//
// Our forward also runs with 32 query rows a warp where heads are up to 64 (`forward_warp32_ms`,
// column "fwd w32"): a variant of the same values, timed beside the default; and our backward with
// dq summed by atomics in the key-side pass (`backward_atomic_dq_ms`, column "bwd atomic";
// five products, not deterministic), beside the default's two kernels.
// Both sides: causal, bf16 q, k, v packed as a [B, T, 3C] product output (nanoGPT's split and
// views on the PyTorch side), a bf16 output and its bf16 gradient, dq, dk, dv in bf16. Each call
// is timed alone between two events; reported are medians (ms) and TFLOP/s by FlashAttention's
// count: the forward's two T x T products (4 B NH T^2 D, halved for the causal mask), the backward
// 2.5 times that (five products; ours recomputes two more: the dq kernel's scores and dP).
// PyTorch's backward is its forward + backward less its forward. Output: one JSON line per shape
// and side, then a table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "bench/lib/command_output.h"
#include "bench/lib/torch_peer.h"
#include "meshtrain/cuda/availability.h"
#include "meshtrain/tensor/tensor.h"
#include "meshtrain/util/error.h"

#if MESHTRAIN_HAVE_CUDA
#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/device.h"
#include "meshtrain/cuda/kernels/flash_attention.h"
#include "meshtrain/cuda/stream.h"
#endif

using namespace meshtrain;

namespace {

struct AttentionShape {
  std::string name;
  int64_t B, NH, T, D;
  double forward_flop() const { return 4.0 * B * NH * T * T * D / 2; }
  double backward_flop() const { return 2.5 * forward_flop(); }
};

const std::vector<AttentionShape>& known_shapes() {
  static const std::vector<AttentionShape> k = {
      {"gpt2", 8, 12, 1024, 64},     // GPT-2 124M's attention at gpu_train_bench's batch
      {"gpt2-4k", 2, 12, 4096, 64},  // the same tokens in longer sequences
      {"d128", 4, 16, 2048, 128},    // heads of 128 (GPT-3 XL, Llama)
      {"d32", 16, 8, 1024, 32},      // small heads
  };
  return k;
}

#if MESHTRAIN_HAVE_CUDA
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Tensor random_bf16(int64_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(gen);
  return Tensor::from_vector(v, {n}).to(DType::bf16).to(Device::cuda(0));
}

struct Timing {
  double forward_ms = 0, backward_ms = 0;
  double forward_warp32_ms = 0;      // the forward with 32 query rows a warp (heads up to 64), or 0
  double backward_atomic_dq_ms = 0;  // the backward with dq summed by atomics
};

// Median milliseconds of fn over `iters` calls after `warmup`, each between two events.
template <typename Fn>
double time_ms(Fn&& fn, int iters, int warmup, cudaStream_t stream) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> ms;
  cuda::Event start(true), end(true);
  for (int i = 0; i < iters; ++i) {
    start.record(stream);
    fn();
    end.record(stream);
    end.synchronize();
    ms.push_back(start.elapsed_ms(end));
  }
  return median(ms);
}

Timing run_meshtrain(const AttentionShape& s, int iters, int warmup) {
  const int64_t C = s.NH * s.D;
  const cudaStream_t stream = cuda::current_stream(0);
  const Tensor qkv = random_bf16(s.B * s.T * 3 * C, 1);
  const Tensor dout = random_bf16(s.B * s.T * C, 2);
  Tensor out = Tensor::empty({s.B * s.T * C}, DType::bf16, Device::cuda(0));
  Tensor lse = Tensor::empty({s.B * s.NH * s.T}, DType::f32, Device::cuda(0));
  Tensor scratch = Tensor::empty({s.B * s.NH * s.T}, DType::f32, Device::cuda(0));
  Tensor dqkv = Tensor::empty({s.B * s.T * 3 * C}, DType::bf16, Device::cuda(0));
  int warp_rows = 16;
  auto forward = [&] {
    cuda::flash_attention_forward(out.data_ptr(), DType::bf16, static_cast<float*>(lse.data_ptr()),
                                  qkv.data_ptr(), DType::bf16, s.B, s.T, C, s.NH, stream,
                                  warp_rows);
  };
  auto backward = [&] {
    cuda::flash_attention_backward(
        dqkv.data_ptr(), DType::bf16, static_cast<float*>(scratch.data_ptr()), dout.data_ptr(),
        qkv.data_ptr(), DType::bf16, out.data_ptr(), DType::bf16,
        static_cast<const float*>(lse.data_ptr()), s.B, s.T, C, s.NH, stream);
  };
  Timing t;
  if (s.D <= 64) {
    warp_rows = 32;
    t.forward_warp32_ms = time_ms(forward, iters, warmup, stream);
    warp_rows = 16;
  }
  t.forward_ms = time_ms(forward, iters, warmup, stream);
  cuda::set_flash_backward_atomic_dq(true);
  t.backward_atomic_dq_ms = time_ms(backward, iters, warmup, stream);
  cuda::set_flash_backward_atomic_dq(false);
  t.backward_ms = time_ms(backward, iters, warmup, stream);
  // A gradient that is not finite would make the timing meaningless: say so.
  const auto g = dqkv.to(DType::f32).to(Device::cpu()).to_vector();
  MT_CHECK(std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); }),
           "attention_bench: shape ", s.name, ": the backward wrote a value that is not finite");
  return t;
}
#endif

// PyTorch's figures for every shape, keyed by name; {"skipped": why} under "" when it did not run.
std::map<std::string, nlohmann::json> run_torch_with(const std::string& python,
                                                     const std::string& script,
                                                     const std::vector<AttentionShape>& shapes,
                                                     int iters, int warmup, int timeout_s) {
  nlohmann::json spec = nlohmann::json::array();
  for (const AttentionShape& s : shapes)
    spec.push_back({{"name", s.name}, {"B", s.B}, {"NH", s.NH}, {"T", s.T}, {"D", s.D}});
  std::ostringstream cmd;
  cmd << "timeout " << timeout_s << " " << python << " " << script << " --iters " << iters
      << " --warmup " << warmup << " --shapes '" << spec.dump() << "' 2>&1";
  const bench::CommandOutput run = bench::run_command(cmd.str());
  std::map<std::string, nlohmann::json> out;
  if (!run.started) {
    out[""] = {{"skipped", "cannot start " + python}};
    return out;
  }
  std::istringstream lines(run.text);
  std::string line, tail;
  while (std::getline(lines, line)) {
    if (!line.empty()) tail = line;
    if (line.empty() || line[0] != '{') continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    if (j.contains("skipped")) out[""] = j;
    if (j.contains("name")) out[j["name"].get<std::string>()] = j;
  }
  if (out.empty())
    out[""] = {{"skipped", "the PyTorch script failed (exit status " + std::to_string(run.status) +
                               "): " + tail}};
  return out;
}

std::map<std::string, nlohmann::json> run_torch(const bench::TorchPeer& peer,
                                                const std::vector<AttentionShape>& shapes,
                                                int iters, int warmup) {
  return peer.run(
      [&](const std::string& python) {
        return run_torch_with(python, peer.script, shapes, iters, warmup, peer.timeout_s);
      },
      [](const std::map<std::string, nlohmann::json>& out) {
        const auto skipped = out.find("");
        return skipped != out.end() &&
               skipped->second.value("skipped", std::string()).find("not importable") !=
                   std::string::npos;
      });
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"meshtrain's flash attention kernels on a CUDA device, against PyTorch's SDPA"};
  std::vector<std::string> names{"gpt2", "gpt2-4k", "d128", "d32"};
  int iters = 20, warmup = 5;
  bench::TorchPeer torch_peer;
  torch_peer.script = bench::source_file(
      std::filesystem::path("bench") / "python" / "attention_bench_torch.py", MESHTRAIN_SOURCE_DIR);
  std::string shape_help = "shapes to run, or all:";
  for (const AttentionShape& s : known_shapes())
    shape_help += " " + s.name + " (B" + std::to_string(s.B) + " NH" + std::to_string(s.NH) + " T" +
                  std::to_string(s.T) + " D" + std::to_string(s.D) + ")";
  app.add_option("--shapes", names, shape_help)->delimiter(',');
  app.add_option("--iters", iters, "timed calls per kernel")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "untimed calls before timing")->check(CLI::NonNegativeNumber);
  torch_peer.add_options(app, "for the PyTorch side");
  CLI11_PARSE(app, argc, argv);
  const bool no_torch = torch_peer.skip;

  std::vector<AttentionShape> shapes;
  for (const std::string& n : names) {
    if (n == "all") {
      shapes = known_shapes();
      break;
    }
    auto it = std::find_if(known_shapes().begin(), known_shapes().end(),
                           [&](const AttentionShape& s) { return s.name == n; });
    if (it == known_shapes().end()) {
      std::cerr << "attention_bench: unknown shape '" << n
                << "' (expected gpt2, gpt2-4k, d128, d32 or all)\n";
      return 2;
    }
    shapes.push_back(*it);
  }

  if (cuda::device_count() == 0) {
    std::cout << nlohmann::json{{"bench", "attention"},
                                {"impl", "meshtrain-flash"},
                                {"skipped", cuda::unavailable_reason()}}
                     .dump()
              << std::endl;
    if (!no_torch) {
      // PyTorch says for itself whether it could have run here.
      for (const auto& [name, j] : run_torch(torch_peer, shapes, iters, warmup)) {
        nlohmann::json line = j;
        line["bench"] = "attention";
        line["impl"] = "pytorch-sdpa-flash";
        std::cout << line.dump() << std::endl;
      }
    }
    return 0;
  }
#if MESHTRAIN_HAVE_CUDA
  cuda::use_device(0);
  const std::string device_name = cuda::device_properties(0).str();
  std::map<std::string, Timing> ours;
  for (const AttentionShape& s : shapes) {
    try {
      ours[s.name] = run_meshtrain(s, iters, warmup);
    } catch (const std::exception& e) {
      std::cout << nlohmann::json{{"bench", "attention"},
                                  {"impl", "meshtrain-flash"},
                                  {"shape", s.name},
                                  {"error", e.what()}}
                       .dump()
                << std::endl;
      continue;
    }
    const Timing& t = ours[s.name];
    std::cout << nlohmann::json{{"bench", "attention"},
                                {"impl", "meshtrain-flash"},
                                {"device", device_name},
                                {"shape", s.name},
                                {"B", s.B},
                                {"NH", s.NH},
                                {"T", s.T},
                                {"D", s.D},
                                {"forward_ms", t.forward_ms},
                                {"forward_warp32_ms", t.forward_warp32_ms},
                                {"backward_ms", t.backward_ms},
                                {"backward_atomic_dq_ms", t.backward_atomic_dq_ms},
                                {"forward_tflops", s.forward_flop() / t.forward_ms * 1e-9},
                                {"backward_tflops", s.backward_flop() / t.backward_ms * 1e-9}}
                     .dump()
              << std::endl;
    cuda::CachingAllocator::for_device(0).empty_cache();
  }
  std::map<std::string, nlohmann::json> torch;
  if (!no_torch) torch = run_torch(torch_peer, shapes, iters, warmup);
  for (const auto& [name, j] : torch) {
    nlohmann::json line = j;
    line["bench"] = "attention";
    line["impl"] = "pytorch-sdpa-flash";
    auto mine = ours.find(name);
    if (mine != ours.end() && j.contains("forward_ms") && j.contains("backward_ms")) {
      line["meshtrain_forward_ratio"] = j["forward_ms"].get<double>() / mine->second.forward_ms;
      line["meshtrain_backward_ratio"] = j["backward_ms"].get<double>() / mine->second.backward_ms;
    }
    std::cout << line.dump() << std::endl;
  }

  std::printf("\n%s; causal, bf16; TFLOP/s by FlashAttention's count; ratio = PyTorch ms / ours\n",
              device_name.c_str());
  std::printf("%-8s %22s %12s %22s %12s %14s %14s %8s %8s\n", "shape", "ours fwd ms (TFLOP/s)",
              "fwd w32 ms", "ours bwd ms (TFLOP/s)", "bwd atomic", "torch fwd ms", "torch bwd ms",
              "fwd", "bwd");
  for (const AttentionShape& s : shapes) {
    auto mine = ours.find(s.name);
    if (mine == ours.end()) {
      std::printf("%-8s failed: see its error line above\n", s.name.c_str());
      continue;
    }
    const Timing& t = mine->second;
    std::printf("%-8s %10.3f (%9.1f) %12s %10.3f (%9.1f) %12.3f", s.name.c_str(), t.forward_ms,
                s.forward_flop() / t.forward_ms * 1e-9,
                t.forward_warp32_ms > 0 ? std::to_string(t.forward_warp32_ms).c_str() : "-",
                t.backward_ms, s.backward_flop() / t.backward_ms * 1e-9, t.backward_atomic_dq_ms);
    auto theirs = torch.find(s.name);
    if (theirs != torch.end() && theirs->second.contains("backward_ms")) {
      const double f = theirs->second["forward_ms"].get<double>();
      const double b = theirs->second["backward_ms"].get<double>();
      std::printf(" %14.3f %14.3f %8.2f %8.2f\n", f, b, f / t.forward_ms, b / t.backward_ms);
    } else {
      const auto skipped = torch.find("");
      std::printf("  PyTorch: %s\n", no_torch ? "--no-torch"
                                     : skipped != torch.end()
                                         ? skipped->second.value("skipped", "no result").c_str()
                                         : "no result");
    }
  }
#endif
  return 0;
}
