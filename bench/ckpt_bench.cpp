// Checkpoint and restart performance, the three figures the fault-tolerance design promises:
//  (a) write throughput of a synchronous checkpoint of a GPT's model and AdamW state (the real
//      CheckpointWriter: safetensors, xxh3, fsync of every file and directory, rename, `latest`)
//      against the sequential write bandwidth of the same directory measured in the same
//      invocation (plain write() in 8 MiB blocks and one fsync, the same number of bytes),
//      rounds interleaved, medians;
//  (b) how long an asynchronous save blocks the training thread, against the duration of a
//      synchronous save of the same state. A real training step of the same GPT is run the way
//      the trainer runs it: save() after an optimizer step, then the next step's forward and
//      backward while the writer copies the state, then wait_snapshot() before the optimizer
//      step. Blocked = the save call (building the shard list included) + that wait. Also
//      reported: the forward+backward time with and without a save running beside it (the copy
//      and the writes share the cores), and the snapshot copy alone (what save() blocked for when
//      it took the copy before returning);
//  (c) restart time of meshrun --max-restarts after a worker is killed with SIGKILL: from the
//      kill to the first step of the resumed job, split at the agent's restart line and the
//      workers' "resumed from" line (which follows the checkpoint load), at 2 and 4 ranks.
// Output: one JSON line per measurement and per summary, then a table.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/train_state.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/util/error.h"

using namespace meshtrain;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void emit(const nlohmann::json& j) {
  std::cout << j.dump() << std::endl;
}

// A GPT and its AdamW optimizer, one step in (so that the moments exist): the state the trainer
// checkpoints, taken the way it takes it (live tensors, no copies), and the step it runs.
class Training {
 public:
  Training(int64_t layers, int64_t width, int64_t batch, int64_t seq) {
    nn::GPTConfig gc;
    gc.n_layer = layers;
    gc.n_embd = width;
    gc.n_head = 8;
    gc.block_size = std::max<int64_t>(256, seq);
    gc.vocab_size = 257;
    model_ = std::make_unique<nn::GPT>(gc);
    optimizer_ = std::make_unique<optim::AdamW>(model_->named_parameters(), optim::AdamWOptions{});
    std::vector<int32_t> x(static_cast<size_t>(batch * seq)), y(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x[i] = static_cast<int32_t>((i * 7 + 3) % 256);
      y[i] = static_cast<int32_t>((i * 7 + 10) % 256);
    }
    x_ = Tensor::from_vector(x, {batch, seq});
    y_ = Tensor::from_vector(y, {batch, seq});
    forward_backward();
    optimizer_step();
  }

  ckpt::RankShards shards(nlohmann::json& train_state) const {
    ckpt::RankShards out;
    out.add_replicated("model", model_->state_dict());
    train_state["optimizer"] = ckpt::add_optimizer_state(out, optimizer_->state_view());
    return out;
  }
  double forward_backward() {
    const auto t0 = Clock::now();
    optimizer_->zero_grad();
    autograd::backward(model_->loss(x_, y_));
    return since(t0);
  }
  void optimizer_step() { optimizer_->step(); }

 private:
  std::unique_ptr<nn::GPT> model_;
  std::unique_ptr<optim::AdamW> optimizer_;
  Tensor x_, y_;
};

// Sequential write bandwidth: `bytes` written with write() in 8 MiB blocks, then fsync.
double disk_write_s(const fs::path& path, uint64_t bytes) {
  constexpr size_t kBlock = size_t{8} << 20;
  static std::vector<char> block = [] {
    std::vector<char> b(kBlock);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (char& c : b) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      c = static_cast<char>(x);
    }
    return b;
  }();
  const auto t0 = Clock::now();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) MT_THROW(IoError, "cannot create ", path.string(), ": ", std::strerror(errno));
  for (uint64_t left = bytes; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, kBlock));
    const ssize_t w = ::write(fd, block.data(), n);
    if (w <= 0) MT_THROW(IoError, "cannot write ", path.string(), ": ", std::strerror(errno));
    left -= static_cast<uint64_t>(w);
  }
  if (::fsync(fd) != 0) MT_THROW(IoError, "cannot fsync ", path.string());
  ::close(fd);
  const double s = since(t0);
  fs::remove(path);
  return s;
}

void remove_steps(const fs::path& root) {
  for (int64_t step : ckpt::list_complete_steps(root.string()))
    fs::remove_all(root / ckpt::step_dir_name(step));
}

// ---- (c) restart ----------------------------------------------------------------------------

// Milliseconds since the epoch of a "YYYY-MM-DDTHH:MM:SS.mmm" local-time stamp in `line`.
std::optional<int64_t> stamp_ms(const std::string& line) {
  static const std::regex kStamp(
      "(\\d{4})-(\\d{2})-(\\d{2})T(\\d{2}):(\\d{2}):(\\d{2})\\.(\\d{3})");
  std::smatch m;
  if (!std::regex_search(line, m, kStamp)) return std::nullopt;
  std::tm tm{};
  tm.tm_year = std::stoi(m[1]) - 1900;
  tm.tm_mon = std::stoi(m[2]) - 1;
  tm.tm_mday = std::stoi(m[3]);
  tm.tm_hour = std::stoi(m[4]);
  tm.tm_min = std::stoi(m[5]);
  tm.tm_sec = std::stoi(m[6]);
  tm.tm_isdst = -1;
  return static_cast<int64_t>(std::mktime(&tm)) * 1000 + std::stoi(m[7]);
}

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int run_quiet(const std::string& cmd) {
  return std::system((cmd + " > /dev/null 2>&1").c_str());
}

std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> v;
  for (pid_t c; in >> c;) v.push_back(c);
  return v;
}

struct RestartTiming {
  double kill_to_restart_s = 0;     // failure seen, other workers stopped, agent decides
  double restart_to_resumed_s = 0;  // new workers start, rendezvous, checkpoint loaded
  double resumed_to_step_s = 0;     // the first resumed step completes
  double total_s = 0;
};

std::optional<RestartTiming> measure_restart(const fs::path& bin, const fs::path& work, int ranks) {
  const fs::path out = work / ("restart_" + std::to_string(ranks));
  fs::remove_all(out);
  const std::string log = (work / ("restart_" + std::to_string(ranks) + ".log")).string();
  const std::string cmd =
      (bin / "meshrun").string() + " --nproc-per-node " + std::to_string(ranks) +
      " --max-restarts 1 --grace-period 5 -- " + (bin / "meshtrain").string() +
      " train --set data.dir=" + (work / "data").string() + " --set train.out_dir=" + out.string() +
      " --set model.n_layer=2 --set model.n_embd=64 --set model.n_head=4"
      " --set model.block_size=64 --set data.batch_size=4 --set train.threads=1"
      " --set data.val_batches=1 --set train.eval_interval=0 --set train.log_interval=1"
      " --set train.sample_tokens=0 --set train.save_weights=false --set train.steps=1000000"
      " --set ckpt.interval=5 --set dist.timeout_s=60";
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl("/bin/sh", "sh", "-c", ("exec " + cmd).c_str(), static_cast<char*>(nullptr));
    ::_exit(99);
  }
  auto wait_until = [](auto pred, std::chrono::seconds limit) {
    const auto deadline = Clock::now() + limit;
    while (!pred() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    return pred();
  };
  const bool saved =
      wait_until([&] { return fs::exists(out / "checkpoints" / "step_10" / "manifest.json"); },
                 std::chrono::seconds(300));
  std::vector<pid_t> workers = children_of(pid);
  if (!saved || static_cast<int>(workers.size()) != ranks) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    std::cerr << "restart bench at " << ranks << " ranks: the job did not get going; see " << log
              << "\n";
    return std::nullopt;
  }
  const int64_t killed_ms = now_ms();
  ::kill(workers.back(), SIGKILL);
  // Done once the resumed job has logged a step.
  static const std::regex kStep(" rank 0 step \\d+ \\| step ");
  std::vector<std::string> lines;
  auto read_log = [&] {
    lines.clear();
    std::ifstream in(log);
    for (std::string l; std::getline(in, l);) lines.push_back(l);
  };
  std::optional<int64_t> restart_ms, resumed_ms, step_ms;
  wait_until(
      [&] {
        read_log();
        restart_ms = resumed_ms = step_ms = std::nullopt;
        for (const std::string& l : lines) {
          if (!restart_ms) {
            if (l.find("restart 1 of 1") != std::string::npos) restart_ms = stamp_ms(l);
          } else if (!resumed_ms) {
            if (l.find("resumed from") != std::string::npos) resumed_ms = stamp_ms(l);
          } else if (std::regex_search(l, kStep)) {
            step_ms = stamp_ms(l);
            break;
          }
        }
        return step_ms.has_value();
      },
      std::chrono::seconds(120));
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  if (!restart_ms || !resumed_ms || !step_ms) {
    std::cerr << "restart bench at " << ranks << " ranks: no resumed step in " << log << "\n";
    return std::nullopt;
  }
  RestartTiming t;
  t.kill_to_restart_s = static_cast<double>(*restart_ms - killed_ms) / 1000;
  t.restart_to_resumed_s = static_cast<double>(*resumed_ms - *restart_ms) / 1000;
  t.resumed_to_step_s = static_cast<double>(*step_ms - *resumed_ms) / 1000;
  t.total_s = static_cast<double>(*step_ms - killed_ms) / 1000;
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Checkpoint write throughput, async blocking time and restart time."};
  std::string dir = "ckpt_bench.tmp";
  int64_t layers = 6, width = 512, batch = 4, seq = 128;
  int rounds = 5;
  std::vector<int> restart_ranks{2, 4};
  app.add_option("--dir", dir, "scratch directory on the disk to measure (removed at the end)");
  app.add_option("--layers", layers, "GPT blocks of the checkpointed state");
  app.add_option("--width", width, "GPT width of the checkpointed state");
  app.add_option("--batch", batch, "sequences per training step in (b)");
  app.add_option("--seq", seq, "tokens per sequence in (b)");
  app.add_option("--rounds", rounds, "interleaved rounds (medians are reported)");
  app.add_option("--restart-ranks", restart_ranks, "world sizes for the restart measurement");
  bool skip_restart = false;
  app.add_flag("--skip-restart", skip_restart, "measure only the checkpoint writes");
  CLI11_PARSE(app, argc, argv);

  try {
    const fs::path work = fs::absolute(dir);
    fs::create_directories(work);
    const fs::path root = work / "ckpt";

    Training training(layers, width, batch, seq);
    nlohmann::json probe_state = nlohmann::json::object();
    const uint64_t bytes = training.shards(probe_state).nbytes();
    std::cerr << "checkpoint state: " << bytes / 1e6 << " MB (GPT " << layers << "x" << width
              << " model + AdamW moments), training step " << batch << "x" << seq << " tokens, "
              << rounds << " rounds in " << work.string() << "\n";

    // Every round: disk probe, synchronous save, a step alone, a step beside an asynchronous
    // save, and the snapshot copy alone.
    std::vector<double> disk_s, sync_s, blocked_s, call_s, snapshot_wait_s, async_total_s;
    std::vector<double> compute_s, compute_during_save_s, copy_s;
    ckpt::WriterOptions sync_opts;
    sync_opts.root = root.string();
    sync_opts.async = false;
    sync_opts.retention.keep_last = 0;
    ckpt::WriterOptions async_opts = sync_opts;
    async_opts.async = true;
    async_opts.deferred_snapshot = true;  // as the trainer uses it
    ckpt::WriterOptions copy_opts = async_opts;
    copy_opts.deferred_snapshot = false;
    ckpt::CheckpointWriter sync_writer(sync_opts);
    ckpt::CheckpointWriter async_writer(async_opts);
    ckpt::CheckpointWriter copy_writer(copy_opts);
    int64_t step = 0;
    for (int r = 0; r < rounds; ++r) {
      disk_s.push_back(disk_write_s(work / "disk_probe.bin", bytes));

      auto t0 = Clock::now();
      {
        nlohmann::json st = {{"step", ++step}};
        sync_writer.save(step, training.shards(st), st);
      }
      sync_s.push_back(since(t0));
      remove_steps(root);

      compute_s.push_back(training.forward_backward());
      training.optimizer_step();

      // The trainer's order: save after the optimizer step, then the next step.
      t0 = Clock::now();
      {
        nlohmann::json st = {{"step", ++step}};
        async_writer.save(step, training.shards(st), st);
      }
      call_s.push_back(since(t0));
      compute_during_save_s.push_back(training.forward_backward());
      snapshot_wait_s.push_back(async_writer.wait_snapshot());
      blocked_s.push_back(call_s.back() + snapshot_wait_s.back());
      training.optimizer_step();
      async_writer.wait();
      async_total_s.push_back(since(t0));
      remove_steps(root);

      {
        nlohmann::json st = {{"step", ++step}};
        copy_s.push_back(copy_writer.save(step, training.shards(st), st).snapshot_s);
        copy_writer.wait();
      }
      remove_steps(root);
      emit({{"bench", "ckpt_round"},
            {"round", r},
            {"bytes", bytes},
            {"disk_write_s", disk_s.back()},
            {"sync_save_s", sync_s.back()},
            {"async_save_call_s", call_s.back()},
            {"async_wait_before_optimizer_step_s", snapshot_wait_s.back()},
            {"async_blocked_s", blocked_s.back()},
            {"async_total_s", async_total_s.back()},
            {"forward_backward_s", compute_s.back()},
            {"forward_backward_during_save_s", compute_during_save_s.back()},
            {"snapshot_copy_s", copy_s.back()}});
    }
    const double disk_mbps = static_cast<double>(bytes) / median(disk_s) / 1e6;
    const double ckpt_mbps = static_cast<double>(bytes) / median(sync_s) / 1e6;
    const double write_ratio = ckpt_mbps / disk_mbps;
    const double blocked_ratio = median(blocked_s) / median(sync_s);
    emit({{"bench", "ckpt_write_throughput"},
          {"bytes", bytes},
          {"ckpt_MBps", ckpt_mbps},
          {"disk_MBps", disk_mbps},
          {"ratio", write_ratio},
          {"goal", ">= 0.8"}});
    emit({{"bench", "ckpt_async_blocking"},
          {"blocked_s", median(blocked_s)},
          {"save_call_s", median(call_s)},
          {"wait_before_optimizer_step_s", median(snapshot_wait_s)},
          {"sync_save_s", median(sync_s)},
          {"ratio", blocked_ratio},
          {"forward_backward_s", median(compute_s)},
          {"forward_backward_during_save_s", median(compute_during_save_s)},
          {"snapshot_copy_s", median(copy_s)},
          {"goal", "< 0.05"}});

    // (c)
    std::vector<std::pair<int, RestartTiming>> restarts;
    if (!skip_restart) {
      const fs::path bin = fs::canonical("/proc/self/exe").parent_path();
      {
        std::ofstream text(work / "text.txt");
        for (int i = 0; i < 20000; ++i)
          text << "line " << i % 89 << " of the text, word " << (i * 7) % 31 << ".\n";
      }
      if (run_quiet((bin / "meshtrain").string() + " data prepare --input " +
                    (work / "text.txt").string() + " --out " + (work / "data").string()) != 0)
        MT_THROW(Error, "meshtrain data prepare failed (is meshtrain built next to ckpt_bench?)");
      for (int ranks : restart_ranks) {
        auto t = measure_restart(bin, work, ranks);
        if (!t) continue;
        restarts.emplace_back(ranks, *t);
        emit({{"bench", "restart"},
              {"ranks", ranks},
              {"kill_to_first_resumed_step_s", t->total_s},
              {"kill_to_restart_s", t->kill_to_restart_s},
              {"restart_to_resumed_s", t->restart_to_resumed_s},
              {"resumed_to_first_step_s", t->resumed_to_step_s},
              {"goal", "< 10 s plus load time"}});
      }
    }

    std::printf("\n%-44s %12s %12s %8s %10s\n", "measurement", "meshtrain", "reference", "ratio",
                "goal");
    std::printf("%-44s %9.0f MB/s %7.0f MB/s %8.2f %10s\n", "checkpoint write vs disk write+fsync",
                ckpt_mbps, disk_mbps, write_ratio, ">= 0.80");
    std::printf("%-44s %10.4f s %10.3f s %8.4f %10s\n", "async save: training blocked vs sync save",
                median(blocked_s), median(sync_s), blocked_ratio, "< 0.05");
    std::printf("%-44s %10.4f s / %.4f s\n", "  (save call / wait before optimizer step)",
                median(call_s), median(snapshot_wait_s));
    std::printf("%-44s %10.3f s / %.3f s (%.2fx)\n", "  forward+backward alone / beside the save",
                median(compute_s), median(compute_during_save_s),
                median(compute_during_save_s) / median(compute_s));
    std::printf("%-44s %10.3f s\n", "  snapshot copy alone", median(copy_s));
    for (const auto& [ranks, t] : restarts) {
      char name[64];
      std::snprintf(name, sizeof(name), "restart, %d ranks: kill -9 to first step", ranks);
      std::printf("%-44s %10.2f s %12s %8s %10s\n", name, t.total_s, "", "", "< 10 s");
      std::printf("%-44s %10.2f s / %.2f s / %.2f s\n", "  (stop+decide / start+load / step)",
                  t.kill_to_restart_s, t.restart_to_resumed_s, t.resumed_to_step_s);
    }
    fs::remove_all(work);
  } catch (const std::exception& e) {
    std::cerr << "ckpt_bench: error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
