// Checkpoints on object storage (ckpt.dir = s3://...), the two figures the design promises,
// against an S3-compatible server given by AWS_ENDPOINT_URL and the AWS_* credentials (the
// script bench/s3_upload_bench.sh starts a local s3rver):
//  (a) upload throughput of a checkpoint-sized file by the client the mirror uses
//      (S3ObjectStore::put_file: one streamed PUT below 8 parts, multipart with --parallel parts
//      in flight from there; the MD5 of every body computed beside the send and checked against
//      the server's ETag) against `curl --upload-file` of the same bytes to the same server (one
//      signed PUT, nothing checked), rounds interleaved, medians;
//  (b) how long a training step waits for uploads: a loop of fixed-work steps (a compute
//      kernel on this thread) saving a checkpoint every few steps through the real
//      CheckpointWriter (async, the trainer's deferred snapshot), first without a mirror and
//      then with the CheckpointMirror uploading each committed checkpoint in the background.
//      Reported: the time the training thread spends handing a checkpoint to the mirror
//      (enqueue), and the median step time while uploads run against the median without them
//      (the cores are shared).
// Output: one JSON line per summary, then a table.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "meshtrain/ckpt/checkpoint_writer.h"
#include "meshtrain/ckpt/object_store.h"
#include "meshtrain/ckpt/remote_checkpoints.h"

namespace fs = std::filesystem;
using namespace meshtrain;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// A fixed amount of floating-point work (about `ms` on this core when calibrated).
float work(std::vector<float>& a, int64_t reps) {
  float acc = 0;
  for (int64_t r = 0; r < reps; ++r)
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = a[i] * 0.999f + 0.001f * static_cast<float>(i & 7);
      acc += a[i];
    }
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("upload throughput and training-step wait of s3:// checkpoints");
  int64_t mb = 256, rounds = 5, steps = 40, every = 5, ckpt_mb = 128;
  double step_ms = 200;
  std::string bucket = "bench", dir = fs::temp_directory_path() / "mt_s3_bench";
  int parallel = 4;
  int64_t part_mb = 64;
  app.add_option("--mb", mb, "bytes of the throughput file, MiB");
  app.add_option("--rounds", rounds, "throughput rounds (interleaved)");
  app.add_option("--bucket", bucket, "bucket (exists)");
  app.add_option("--dir", dir, "scratch directory");
  app.add_option("--parallel", parallel, "parts in flight");
  app.add_option("--part-mb", part_mb, "multipart part size, MiB");
  app.add_option("--steps", steps, "training steps of part (b), per phase");
  app.add_option("--every", every, "checkpoint every N steps");
  app.add_option("--ckpt-mb", ckpt_mb, "checkpoint size, MiB");
  app.add_option("--step-ms", step_ms, "compute per step, ms (calibrated)");
  CLI11_PARSE(app, argc, argv);

  const ckpt::S3Settings settings = ckpt::S3Settings::from_environment();
  ckpt::TransferOptions to;
  to.parallel = parallel;
  to.part_size = static_cast<uint64_t>(part_mb) << 20;
  to.multipart_threshold = 8 * to.part_size;
  auto store = std::make_shared<ckpt::S3ObjectStore>(settings, bucket, to);
  fs::remove_all(dir);
  fs::create_directories(dir);

  // (a) throughput.
  const std::string file = (fs::path(dir) / "blob.bin").string();
  {
    std::vector<char> buf(1 << 20);
    std::mt19937_64 rng(1);
    std::ofstream out(file, std::ios::binary);
    for (int64_t i = 0; i < mb; ++i) {
      for (auto& c : buf) c = static_cast<char>(rng());
      out.write(buf.data(), static_cast<std::streamsize>(buf.size()));
    }
  }
  const double bytes = static_cast<double>(mb) * 1048576.0;
  std::vector<double> ours, raw;
  const std::string curl =
      "curl -sS -f --aws-sigv4 aws:amz:" + settings.region + ":s3 --user " + settings.access_key +
      ":" + settings.secret_key + " -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -H 'Expect:'" +
      " --upload-file " + file + " " + settings.endpoint + "/" + bucket + "/raw.bin -o /dev/null";
  for (int64_t r = 0; r < rounds; ++r) {
    auto t0 = Clock::now();
    store->put_file("ours.bin", file);
    ours.push_back(bytes / since(t0) / 1e6);
    t0 = Clock::now();
    if (std::system(curl.c_str()) != 0) {
      std::cerr << "curl --upload-file failed\n";
      return 1;
    }
    raw.push_back(bytes / since(t0) / 1e6);
  }
  const double ours_mbs = median(ours), raw_mbs = median(raw);
  std::cout << nlohmann::json{{"bench", "s3_upload"},
                              {"mib", mb},
                              {"rounds", rounds},
                              {"parallel", parallel},
                              {"part_mib", part_mb},
                              {"mirror_client_MBps", ours_mbs},
                              {"curl_upload_file_MBps", raw_mbs},
                              {"ratio", ours_mbs / raw_mbs}}
                   .dump()
            << std::endl;
  store->remove("ours.bin");
  store->remove("raw.bin");
  fs::remove(file);

  // (b) the training step's wait.
  std::vector<float> a(1 << 20, 1.0f);  // 4 MiB: stays in cache
  auto t0 = Clock::now();
  work(a, 20);
  const int64_t reps = std::max<int64_t>(1, static_cast<int64_t>(20 * step_ms / 1000 / since(t0)));
  const int64_t n = ckpt_mb * 1048576 / 4;
  Tensor weights = Tensor::empty({n}, DType::f32);
  std::fill(weights.data<float>(), weights.data<float>() + n, 0.5f);

  struct Phase {
    std::vector<double> step_s, step_busy_s;  // every step; the steps while an upload ran
    double enqueue_s = 0, max_enqueue_s = 0, save_s = 0;
    int64_t saves = 0;
  };
  auto run_phase = [&](bool mirror_on) {
    Phase p;
    const std::string root = (fs::path(dir) / (mirror_on ? "with" : "without")).string();
    std::unique_ptr<ckpt::CheckpointMirror> mirror;
    if (mirror_on) {
      ckpt::MirrorOptions mo;
      mo.uri = ckpt::parse_object_uri("s3://" + bucket + "/bench-run");
      mo.local_root = root;
      mo.retention.keep_last = 2;
      mo.parallel = parallel;
      mirror = std::make_unique<ckpt::CheckpointMirror>(store, mo);
    }
    ckpt::WriterOptions wo;
    wo.root = root;
    wo.deferred_snapshot = true;
    wo.retention.keep_last = 2;
    // The trainer's hook: the committed step goes to the mirror on the writer's thread; the
    // training thread never calls into the mirror. The time of that hand-over is what a step
    // could wait for (it is timed here although it runs off the training thread).
    wo.on_done = [&](int64_t step, double, uint64_t, bool ok) {
      if (!ok || !mirror) return;
      const auto e0 = Clock::now();
      mirror->enqueue(step);
      const double e = since(e0);
      p.enqueue_s += e;
      p.max_enqueue_s = std::max(p.max_enqueue_s, e);
    };
    ckpt::CheckpointWriter writer(wo);
    for (int64_t s = 1; s <= steps; ++s) {
      const bool uploading = mirror && mirror->status().pending > 0;
      const auto s0 = Clock::now();
      work(a, reps);
      const double blocked0 = since(s0);
      auto w0 = Clock::now();
      writer.wait_snapshot();
      if (s % every == 0) {
        ckpt::RankShards shards;
        shards.add_replicated("model", "w", weights);
        writer.save(s, shards, {{"step", s}});
        p.saves++;
      }
      p.save_s += since(w0);
      const double step = blocked0 + since(w0);
      p.step_s.push_back(step);
      if (uploading) p.step_busy_s.push_back(step);
    }
    writer.wait();
    if (mirror) mirror->drain(600);
    return p;
  };
  const Phase without = run_phase(false);
  const Phase with = run_phase(true);
  const double base = median(without.step_s);
  const double busy = with.step_busy_s.empty() ? median(with.step_s) : median(with.step_busy_s);
  const double enqueue_per_step = with.enqueue_s / static_cast<double>(steps);
  std::cout << nlohmann::json{{"bench", "s3_step_wait"},
                              {"steps", steps},
                              {"every", every},
                              {"ckpt_mib", ckpt_mb},
                              {"step_ms_without_uploads", base * 1e3},
                              {"step_ms_while_uploading", busy * 1e3},
                              {"steps_while_uploading", with.step_busy_s.size()},
                              {"slowdown_pct", 100.0 * (busy / base - 1.0)},
                              {"enqueue_us_max", with.max_enqueue_s * 1e6},
                              {"wait_for_upload_pct_of_step", 100.0 * enqueue_per_step / base}}
                   .dump()
            << std::endl;
  std::printf("\n%-40s %12s\n", "measure", "value");
  std::printf("%-40s %9.1f MB/s\n", "mirror client put_file", ours_mbs);
  std::printf("%-40s %9.1f MB/s\n", "curl --upload-file", raw_mbs);
  std::printf("%-40s %12.2f\n", "ratio", ours_mbs / raw_mbs);
  std::printf("%-40s %9.1f ms\n", "step, no uploads (median)", base * 1e3);
  std::printf("%-40s %9.1f ms  (%zu steps)\n", "step while an upload runs (median)", busy * 1e3,
              with.step_busy_s.size());
  std::printf("%-40s %9.3f %%\n", "step's wait for the upload", 100.0 * enqueue_per_step / base);
  fs::remove_all(dir);
  return 0;
}
