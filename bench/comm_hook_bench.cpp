// What each gradient comm hook costs and buys: a small GPT is trained with data parallelism
// (ranks are threads, shm collectives) once per hook, from the same initialisation on the same
// data, and the bench reports the bytes each rank puts on the wire per step and the loss reached,
// next to the uncompressed f32 all-reduce.
//
// The data is a synthetic language: a fixed random Markov chain over the vocabulary in which
// every token has a few likely successors, so the loss has a known floor (the chain's entropy)
// that the model approaches within a few hundred steps, and a slower hook shows as a gap.
//
// Output: one JSON line per hook, then a table. Wire bytes are the payload per rank per step
// (what the hook hands to the collective); with a ring the bytes forwarded per rank are about
// 2 (W-1)/W times that for all-reduce and (W-1) times that for top-k's all-gather.
#include <cblas.h>
#include <omp.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/models/gpt_source.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/parallel/engine.h"
#include "meshtrain/tensor/random.h"

using namespace meshtrain;

namespace {

struct Settings {
  int world = 2;
  int steps = 300;
  int64_t n_layer = 2, n_embd = 64, n_head = 4, block_size = 32, batch_size = 8, vocab = 64;
  int successors = 4;  // likely next tokens per token in the synthetic language
  std::string optim = "adamw";
  double lr = 3e-3;
  int eval_batches = 8;
};

// The synthetic language: for each token, `successors` next tokens with probabilities
// 0.5, 0.25, ... (the last one takes the rest).
struct Chain {
  std::vector<std::vector<int32_t>> next;
  std::vector<double> probs;

  Chain(int64_t vocab, int successors, uint64_t seed) {
    Generator g(seed);
    double left = 1.0;
    for (int k = 0; k < successors; ++k) {
      const double p = k + 1 < successors ? left / 2 : left;
      probs.push_back(p);
      left -= p;
    }
    next.resize(static_cast<size_t>(vocab));
    for (auto& n : next)
      for (int k = 0; k < successors; ++k) n.push_back(static_cast<int32_t>(g.below(vocab)));
  }
  double entropy() const {
    double h = 0;
    for (double p : probs) h -= p * std::log(p);
    return h;
  }
  std::pair<Tensor, Tensor> batch(int64_t rows, int64_t t_len, uint64_t seed) const {
    Generator g(seed);
    std::vector<int32_t> x(static_cast<size_t>(rows * t_len)), y(x.size());
    for (int64_t r = 0; r < rows; ++r) {
      auto t = static_cast<int32_t>(g.below(next.size()));
      for (int64_t i = 0; i < t_len; ++i) {
        x[static_cast<size_t>(r * t_len + i)] = t;
        const double u = g.uniform();
        double acc = 0;
        size_t k = 0;
        for (; k + 1 < probs.size(); ++k) {
          acc += probs[k];
          if (u < acc) break;
        }
        t = next[static_cast<size_t>(t)][k];
        y[static_cast<size_t>(r * t_len + i)] = t;
      }
    }
    return {Tensor::from_vector(x, {rows, t_len}), Tensor::from_vector(y, {rows, t_len})};
  }
};

struct Result {
  std::string hook;
  double wire_bytes = 0;  // per rank per step
  double final_loss = 0;  // mean training loss of the last 10% of steps, over ranks
  double eval_loss = 0;   // held-out batches after training
  double step_ms = 0;     // median
  double exposed_ms = 0;  // median time waiting for communication after backward
  int64_t params = 0;
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

Result run_hook(const Settings& s, const Chain& chain, const std::string& hook) {
  comm::register_builtin_backends();
  auto store = std::make_shared<comm::HashStore>();
  static std::atomic<int> id{0};
  const std::string group = "hookbench" + std::to_string(id++);
  std::vector<std::vector<float>> losses(static_cast<size_t>(s.world));
  std::vector<double> wire(static_cast<size_t>(s.world)), eval(wire), step_ms(wire),
      exposed_ms(wire);
  int64_t params_count = 0;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(s.world));
  std::vector<std::thread> threads;
  for (int r = 0; r < s.world; ++r) {
    threads.emplace_back([&, r] {
      try {
        omp_set_num_threads(1);
        comm::ProcessGroupOptions po;
        po.name = group;
        auto pg = comm::make_process_group("shm", store, r, s.world, po);
        nn::GPTConfig gc;
        gc.n_layer = s.n_layer;
        gc.n_embd = s.n_embd;
        gc.n_head = s.n_head;
        gc.block_size = s.block_size;
        gc.vocab_size = s.vocab;
        gc.seed = 7;
        parallel::EngineOptions eo;
        eo.optimizer = s.optim == "sgd" ? optim::OptimizerKind::sgd : optim::OptimizerKind::adamw;
        eo.sgd.lr = static_cast<float>(s.lr);
        eo.sgd.momentum = 0.9f;
        eo.adamw.lr = static_cast<float>(s.lr);
        eo.reducer.comm_hook = parallel::parse_comm_hook_spec(hook);
        parallel::EngineSpec spec;
        spec.model = std::make_shared<models::GptSource>(gc);
        spec.mesh = parallel::data_parallel_mesh(pg);
        spec.options = eo;
        auto engine_owner = parallel::make_engine(std::move(spec));
        parallel::TrainEngine& engine = *engine_owner;
        if (r == 0) params_count = engine.model().num_parameters();
        std::vector<double> times, waits;
        double bytes = 0;
        for (int step = 0; step < s.steps; ++step) {
          const auto t0 = std::chrono::steady_clock::now();
          auto [x, y] =
              chain.batch(s.batch_size, s.block_size,
                          1000003ull * static_cast<uint64_t>(step) + static_cast<uint64_t>(r));
          parallel::StepOptions so;
          so.step = step + 1;
          so.lr = static_cast<float>(s.lr);
          so.grad_clip = 1.0;
          const parallel::StepOutcome out = engine.train_step({{x, y}}, so);
          losses[static_cast<size_t>(r)].push_back(out.loss);
          times.push_back(
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
          waits.push_back(engine.reducer()->stats().wait_s * 1e3);
          bytes += static_cast<double>(engine.reducer()->stats().wire_bytes);
        }
        wire[static_cast<size_t>(r)] = bytes / s.steps;
        step_ms[static_cast<size_t>(r)] = median(times);
        exposed_ms[static_cast<size_t>(r)] = median(waits);
        std::vector<parallel::Batch> eval_batches;
        for (int b = 0; b < s.eval_batches; ++b) {
          auto [x, y] =
              chain.batch(s.batch_size, s.block_size, 0xe5a1ull + static_cast<uint64_t>(b));
          eval_batches.push_back({x, y});
        }
        const double ev = engine.evaluate(eval_batches) * s.eval_batches;
        eval[static_cast<size_t>(r)] = ev / s.eval_batches;
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
  Result res;
  res.hook = hook;
  res.params = params_count;
  res.wire_bytes = wire[0];
  res.eval_loss = eval[0];
  res.step_ms = step_ms[0];
  res.exposed_ms = exposed_ms[0];
  const size_t tail = std::max<size_t>(1, static_cast<size_t>(s.steps) / 10);
  double sum = 0;
  for (const auto& l : losses)
    for (size_t i = l.size() - tail; i < l.size(); ++i) sum += l[i];
  res.final_loss = sum / static_cast<double>(tail * losses.size());
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Bytes and convergence of the data-parallel gradient comm hooks"};
  Settings s;
  std::vector<std::string> hooks = {"allreduce", "bf16",       "f16",       "topk:0.1",
                                    "topk:0.01", "powersgd:1", "powersgd:4"};
  app.add_option("--world", s.world, "ranks (threads)");
  app.add_option("--steps", s.steps, "training steps per hook");
  app.add_option("--hooks", hooks, "hooks to compare (the first is the baseline)");
  app.add_option("--optim", s.optim, "adamw or sgd");
  app.add_option("--lr", s.lr, "learning rate");
  app.add_option("--n-layer", s.n_layer);
  app.add_option("--n-embd", s.n_embd);
  app.add_option("--batch-size", s.batch_size, "sequences per rank per step");
  CLI11_PARSE(app, argc, argv);
  openblas_set_num_threads(1);
  try {
    Chain chain(s.vocab, s.successors, 99);
    std::vector<Result> results;
    for (const std::string& h : hooks) {
      results.push_back(run_hook(s, chain, h));
      const Result& r = results.back();
      const Result& base = results.front();
      nlohmann::json j{{"hook", r.hook},
                       {"world", s.world},
                       {"steps", s.steps},
                       {"params", r.params},
                       {"wire_bytes_per_step", r.wire_bytes},
                       {"wire_ratio", r.wire_bytes / base.wire_bytes},
                       {"final_train_loss", r.final_loss},
                       {"eval_loss", r.eval_loss},
                       {"baseline_eval_loss", base.eval_loss},
                       {"eval_loss_delta", r.eval_loss - base.eval_loss},
                       {"loss_floor", chain.entropy()},
                       {"step_ms", r.step_ms},
                       {"exposed_comm_ms", r.exposed_ms}};
      std::cout << j.dump() << std::endl;
    }
    std::printf("\n%-12s %14s %8s %11s %10s %9s %9s %10s\n", "hook", "bytes/step", "ratio",
                "train_loss", "eval_loss", "delta", "step_ms", "exposed_ms");
    for (const Result& r : results)
      std::printf("%-12s %14.0f %8.4f %11.4f %10.4f %+9.4f %9.2f %10.2f\n", r.hook.c_str(),
                  r.wire_bytes, r.wire_bytes / results.front().wire_bytes, r.final_loss,
                  r.eval_loss, r.eval_loss - results.front().eval_loss, r.step_ms, r.exposed_ms);
    std::printf("loss floor (entropy of the synthetic language): %.4f nats\n", chain.entropy());
  } catch (const std::exception& e) {
    std::cerr << "comm_hook_bench: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
