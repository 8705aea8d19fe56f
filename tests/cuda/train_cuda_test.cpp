// End to end on a real device: a tiny GPT trained for a few steps on cuda:0 must follow the CPU
// run's losses, through the model API, through the Trainer (train.device = "cuda", data upload,
// evaluation, sampling, saved weights) and through the data-parallel reducer over a one-rank nccl
// group. Skipped, with the reason, where the process has no device.
//
// Tolerance: both sides compute in f32 (TF32 off), but the device sums in other orders (cuBLASLt
// tiles, block reductions), so each op differs by a few ulps and the differences grow through the
// AdamW steps. Losses must agree within a relative 1e-3 at every step; the largest difference seen
// is printed so that the bound can be tightened once it has been measured.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "cuda_test_util.h"
#include "meshtrain/autograd/autocast.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/comm/backends.h"
#include "meshtrain/comm/hash_store.h"
#include "meshtrain/comm/process_group.h"
#include "meshtrain/cuda/availability.h"
#include "meshtrain/cuda/nccl/nccl_backend.h"
#include "meshtrain/data/prepare.h"
#include "meshtrain/nn/gpt.h"
#include "meshtrain/obs/gpu_telemetry.h"
#include "meshtrain/optim/adamw.h"
#include "meshtrain/optim/grad_clip.h"
#include "meshtrain/parallel/ddp/reducer.h"
#include "meshtrain/runtime/trainer.h"
#include "meshtrain/tensor/random.h"
#include "tests/cuda/zero_training.h"
#include "tests/data/idx_test_files.h"
#include "tests/parallel/shm_thread_ranks.h"

namespace meshtrain {
namespace {

constexpr double kLossRtol = 1e-3;

class CudaTraining : public ::testing::Test {
 protected:
  void SetUp() override {
    MT_REQUIRE_CUDA_DEVICE();
    cuda::use_device(0);
    cuda::set_allow_tf32(false);
  }
};

nn::GPTConfig tiny_config() {
  nn::GPTConfig gc;
  gc.n_layer = 2;
  gc.n_embd = 64;
  gc.n_head = 4;
  gc.block_size = 32;
  gc.vocab_size = 67;
  return gc;
}

struct Batch {
  Tensor x, y;
};

std::vector<Batch> random_batches(int n, int64_t B, int64_t T, int64_t V) {
  Generator gen(11);
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) {
    std::vector<int32_t> x, y;
    for (int64_t k = 0; k < B * T; ++k) {
      x.push_back(static_cast<int32_t>(gen.below(static_cast<uint64_t>(V))));
      y.push_back(static_cast<int32_t>(gen.below(static_cast<uint64_t>(V))));
    }
    out.push_back({Tensor::from_vector(x, {B, T}), Tensor::from_vector(y, {B, T})});
  }
  return out;
}

// Losses of `steps` AdamW steps (with clipping) of the tiny GPT on `device`.
using MakeReducer = std::function<std::unique_ptr<parallel::Reducer>(const nn::NamedTensors&)>;

std::vector<float> train_model(Device device, const std::vector<Batch>& batches,
                               const MakeReducer& make_reducer = {}, DType precision = DType::f32,
                               int64_t n_head = 4, float dropout = 0.0f, int64_t experts = 0) {
  nn::GPTConfig gc = tiny_config();
  gc.n_head = n_head;
  gc.dropout = dropout;
  if (experts > 0) {
    gc.moe.every = 2;
    gc.moe.num_experts = experts;
    gc.moe.top_k = 2;
  }
  nn::GPT model(gc);
  model.to(device);
  auto params = model.named_parameters();
  std::unique_ptr<parallel::Reducer> reducer = make_reducer ? make_reducer(params) : nullptr;
  optim::AdamWOptions ao;
  ao.lr = 1e-3f;
  ao.beta2 = 0.95f;
  ao.weight_decay = 0.1f;
  optim::AdamW opt(optim::decay_groups(params, ao.weight_decay), ao);
  std::vector<float> losses;
  for (const Batch& b : batches) {
    opt.zero_grad();
    if (reducer) reducer->prepare_for_backward();
    Tensor loss;
    {
      autograd::AutocastGuard autocast(precision);
      loss = model.loss(b.x.to(device), b.y.to(device), 100 + losses.size());
      autograd::backward(loss);
    }
    if (reducer) reducer->finalize_backward();
    optim::clip_grad_norm(params, 1.0);
    opt.step();
    losses.push_back(loss.item());
  }
  return losses;
}

::testing::AssertionResult losses_close(const std::vector<float>& got,
                                        const std::vector<float>& want, double limit = kLossRtol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << got.size() << " losses vs " << want.size();
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) return ::testing::AssertionFailure() << "step " << i << ": NaN";
    const double rel = std::abs(static_cast<double>(got[i]) - want[i]) / std::abs(want[i]);
    worst = std::max(worst, rel);
    if (rel > limit)
      return ::testing::AssertionFailure()
             << "step " << i << ": cuda " << got[i] << " vs cpu " << want[i] << " (relative " << rel
             << ", limit " << limit << ")";
  }
  std::cout << "[ measured ] largest relative loss difference cuda vs cpu: " << worst << "\n";
  return ::testing::AssertionSuccess();
}

TEST_F(CudaTraining, TinyGptFollowsTheCpu) {
  // Two batches, five times each: the model memorises them, so the loss must fall.
  const auto two = random_batches(2, 4, 32, 67);
  std::vector<Batch> batches;
  for (int i = 0; i < 10; ++i) batches.push_back(two[static_cast<size_t>(i % 2)]);
  const std::vector<float> cpu = train_model(Device::cpu(), batches);
  const std::vector<float> dev = train_model(Device::cuda(0), batches);
  EXPECT_TRUE(losses_close(dev, cpu));
  EXPECT_LT(dev[8], dev[0]) << "training on cuda lowers the loss";
}

// Dropout on the device drops the CPU's elements (the same hash of each element's index), so
// the run follows the CPU's as closely as without it; and the masks do change the run.
TEST_F(CudaTraining, TinyGptWithDropoutFollowsTheCpu) {
  const auto batches = random_batches(6, 4, 32, 67);
  const std::vector<float> cpu = train_model(Device::cpu(), batches, {}, DType::f32, 4, 0.1f);
  const std::vector<float> dev = train_model(Device::cuda(0), batches, {}, DType::f32, 4, 0.1f);
  const std::vector<float> plain = train_model(Device::cuda(0), batches);
  EXPECT_TRUE(losses_close(dev, cpu));
  EXPECT_NE(dev, plain);
}

// Mixture-of-experts blocks on the device (router product, dispatch, experts and combine there,
// the router's choice on the host) follow the CPU's run, f32 and bf16. The router's logits are the
// device's product, so a token whose top two nearly tie may go to another expert than on the
// CPU: 2e-2 either way.
TEST_F(CudaTraining, TinyGptWithExpertsFollowsTheCpu) {
  const auto batches = random_batches(6, 4, 32, 67);
  for (const DType precision : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(dtype_name(precision));
    const std::vector<float> cpu =
        train_model(Device::cpu(), batches, {}, precision, 2, 0.0f, /*experts=*/4);
    const std::vector<float> dev =
        train_model(Device::cuda(0), batches, {}, precision, 2, 0.0f, /*experts=*/4);
    EXPECT_TRUE(losses_close(dev, cpu, 2e-2));
  }
}

// bf16 autocast on the device (half GEMMs; heads of 32 take flash attention, whose softmax
// probabilities are bf16 where the CPU's emulation keeps f32) against the CPU's bf16 emulation:
// within bf16's relative 2^-8 per rounding, grown over the steps, so 2e-2.
TEST_F(CudaTraining, TinyGptUnderBf16FollowsTheCpuWithFlashAttention) {
  const auto two = random_batches(2, 4, 32, 67);
  std::vector<Batch> batches;
  for (int i = 0; i < 10; ++i) batches.push_back(two[static_cast<size_t>(i % 2)]);
  const std::vector<float> cpu = train_model(Device::cpu(), batches, {}, DType::bf16, 2);
  const std::vector<float> dev = train_model(Device::cuda(0), batches, {}, DType::bf16, 2);
  EXPECT_TRUE(losses_close(dev, cpu, 2e-2));
  EXPECT_LT(dev[8], dev[0]) << "training under bf16 on cuda lowers the loss";
}

// The goal's check: bf16 losses follow the f32 run on the device over 200 steps.
TEST_F(CudaTraining, Bf16FollowsF32OverTwoHundredSteps) {
  const auto batches = random_batches(200, 4, 32, 67);
  const std::vector<float> f32 = train_model(Device::cuda(0), batches, {}, DType::f32, 2);
  const std::vector<float> bf16 = train_model(Device::cuda(0), batches, {}, DType::bf16, 2);
  EXPECT_TRUE(losses_close(bf16, f32, 3e-2));
}

// The driver's NVML, as the trainer's GPU telemetry loads it, describes the device.
TEST_F(CudaTraining, NvmlReportsTheDevice) {
  obs::GpuTelemetry t(0);
  ASSERT_TRUE(t.available()) << t.unavailable_reason();
  const obs::GpuSample s = t.sample();
  EXPECT_GT(s.memory_total_bytes, int64_t{1} << 30);
  EXPECT_GT(s.memory_used_bytes, 0);
  EXPECT_GT(s.temperature_celsius, 0);
  EXPECT_GT(s.power_watts, 0);
  EXPECT_GE(s.utilization, 0);
  EXPECT_LE(s.utilization, 1);
  std::cout << "[ measured ] NVML: " << s.memory_used_bytes / (1 << 20) << " of "
            << s.memory_total_bytes / (1 << 20) << " MiB, " << s.power_watts << " W, "
            << s.temperature_celsius << " C, utilisation " << s.utilization << ", ECC "
            << s.ecc_uncorrected << ", XID events " << s.xid_events << "\n";
}

#if MESHTRAIN_HAVE_NCCL
// Small buckets, so that several collectives overlap the backward pass.
MakeReducer small_buckets(comm::ProcessGroupPtr pg) {
  return [pg](const nn::NamedTensors& params) {
    parallel::ReducerOptions ro;
    ro.first_bucket_bytes = 16 << 10;
    ro.bucket_bytes = 64 << 10;
    return std::make_unique<parallel::Reducer>(params, pg, ro);
  };
}

TEST_F(CudaTraining, DataParallelOverAOneRankNcclGroupMatchesPlainTraining) {
  ASSERT_TRUE(cuda::register_nccl_backend());
  comm::ProcessGroupOptions po;
  po.name = "cuda-ddp-test";
  po.timeout = std::chrono::seconds(60);
  auto pg = comm::make_process_group("nccl", std::make_shared<comm::HashStore>(), 0, 1, po);
  const auto batches = random_batches(6, 4, 32, 67);
  const std::vector<float> plain = train_model(Device::cuda(0), batches);
  const std::vector<float> ddp = train_model(Device::cuda(0), batches, small_buckets(pg));
  EXPECT_TRUE(losses_close(ddp, plain));
}

// ZeRO-1/2 with the parameters, buckets, shards and optimizer state on the GPU, over a one-rank
// NCCL group (through its parts: the engine makes no ZeRO of one rank, and one GPU holds one
// NCCL rank): the CPU run's losses and parameters within rounding.
TEST_F(CudaTraining, ZeroStagesOneAndTwoOverAOneRankNcclGroupFollowTheCpu) {
  ASSERT_TRUE(cuda::register_nccl_backend());
  comm::register_builtin_backends();
  for (int stage : {1, 2}) {
    SCOPED_TRACE(stage);
    comm::ProcessGroupOptions po;
    po.name = "cuda-zero-" + std::to_string(stage);
    po.timeout = std::chrono::seconds(60);
    auto host = comm::make_process_group("shm", std::make_shared<comm::HashStore>(), 0, 1, po);
    auto nccl = comm::make_process_group("nccl", std::make_shared<comm::HashStore>(), 0, 1, po);
    const test::Trained cpu = test::train_zero_parts(Device::cpu(), stage, host);
    const test::Trained dev = test::train_zero_parts(Device::cuda(0), stage, nccl);
    EXPECT_TRUE(losses_close(dev.losses, cpu.losses));
    ASSERT_EQ(dev.params.size(), cpu.params.size());
    for (size_t i = 0; i < dev.params.size(); ++i)
      for (size_t k = 0; k < dev.params[i].size(); ++k)
        ASSERT_NEAR(dev.params[i][k], cpu.params[i][k], 1e-3)
            << "parameter " << i << "[" << k << "]";
  }
}

// Every ZeRO stage through the engine on two GPUs (threads, one NCCL rank each): the two-rank
// CPU run's losses and parameters within rounding.
TEST_F(CudaTraining, ZeroEveryStageOnTwoDevicesFollowsTheCpu) {
  MT_SKIP_UNLESS("cuda-2", cuda::device_count() >= 2, "needs two CUDA devices");
  ASSERT_TRUE(cuda::register_nccl_backend());
  comm::register_builtin_backends();
  for (int stage : {1, 2, 3}) {
    SCOPED_TRACE(stage);
    std::vector<test::Trained> cpu(2), dev(2);
    testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
      cpu[static_cast<size_t>(r)] = test::train_zero(Device::cpu(), stage, g, nullptr);
    });
    auto store = std::make_shared<comm::HashStore>();
    testing::run_shm_ranks(2, [&](int r, const comm::ProcessGroupPtr& g) {
      cuda::use_device(r);
      comm::ProcessGroupOptions po;
      po.name = "cuda-zero-2-" + std::to_string(stage);
      po.timeout = std::chrono::seconds(60);
      auto nccl = comm::make_process_group("nccl", store, r, 2, po);
      dev[static_cast<size_t>(r)] = test::train_zero(Device::cuda(r), stage, g, nccl);
    });
    cuda::use_device(0);
    for (size_t r = 0; r < 2; ++r) EXPECT_TRUE(losses_close(dev[r].losses, cpu[r].losses));
  }
}

// Two ranks (threads) on two devices, both given the same batches: the averaged gradients are
// each rank's own, so both follow single-device training, and the ranks agree bit for bit.
TEST_F(CudaTraining, DataParallelOnTwoDevicesMatchesOneDevice) {
  MT_SKIP_UNLESS("cuda-2", cuda::device_count() >= 2, "needs two CUDA devices");
  ASSERT_TRUE(cuda::register_nccl_backend());
  const auto batches = random_batches(6, 4, 32, 67);
  const std::vector<float> plain = train_model(Device::cuda(0), batches);
  auto store = std::make_shared<comm::HashStore>();
  std::vector<std::vector<float>> losses(2);
  std::vector<std::string> errors(2);
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r) {
    ranks.emplace_back([&, r] {
      try {
        cuda::use_device(r);
        comm::ProcessGroupOptions po;
        po.name = "cuda-ddp-2";
        po.timeout = std::chrono::seconds(60);
        auto pg = comm::make_process_group("nccl", store, r, 2, po);
        losses[static_cast<size_t>(r)] = train_model(Device::cuda(r), batches, small_buckets(pg));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  cuda::use_device(0);
  for (int r = 0; r < 2; ++r) ASSERT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
  EXPECT_EQ(losses[0], losses[1]) << "replicas diverged";
  EXPECT_TRUE(losses_close(losses[0], plain));
}
#endif

TEST_F(CudaTraining, TrainerRunsWithTrainDeviceCuda) {
  namespace fs = std::filesystem;
  const fs::path root = fs::temp_directory_path() / ("mt_cuda_train_" + std::to_string(::getpid()));
  fs::create_directories(root);
  {
    std::ofstream text(root / "text.txt");
    for (int i = 0; i < 4000; ++i)
      text << "line " << i % 53 << " of the text, word " << (i * 7) % 29 << ".\n";
  }
  data::prepare_text((root / "text.txt").string(), (root / "data").string(), 0.1);
  auto run = [&](const std::string& device, const std::string& precision = "f32") {
    runtime::TrainConfig c;
    c.data.dir = (root / "data").string();
    c.data.batch_size = 4;
    c.data.val_batches = 2;
    c.model.n_layer = 2;
    c.model.n_embd = 64;
    c.model.n_head = 4;
    c.model.block_size = 32;
    c.train.steps = 8;
    c.train.eval_interval = 0;
    c.train.log_interval = 1;
    c.train.sample_tokens = 16;
    c.train.threads = 1;
    c.train.device = device;
    c.train.precision = precision;
    c.train.out_dir = (root / ("run_" + device + "_" + precision)).string();
    runtime::Trainer trainer(c, {});
    return trainer.run();
  };
  const runtime::TrainResult cpu = run("cpu");
  const runtime::TrainResult dev = run("cuda");
  EXPECT_TRUE(losses_close(dev.train_losses, cpu.train_losses));
  EXPECT_TRUE(fs::exists(dev.weights_path)) << "weights saved from device memory";
  EXPECT_EQ(dev.sample.empty(), cpu.sample.empty());
  // train.precision = bf16 on the device: autocast there, against the CPU's emulation of it.
  const runtime::TrainResult cpu_bf16 = run("cpu", "bf16");
  const runtime::TrainResult dev_bf16 = run("cuda", "bf16");
  EXPECT_TRUE(losses_close(dev_bf16.train_losses, cpu_bf16.train_losses, 2e-2));
  fs::remove_all(root);
}

// The Fashion-MNIST ResNet recipe (tiny ResNet, SGD with Nesterov momentum, weight decay) through
// the Trainer on the device: the vision layers, SGD and the test accuracy at the end, on generated
// images in Fashion-MNIST's files (a GPU host need not have the dataset).
TEST_F(CudaTraining, TrainerRunsTheResNetRecipeOnCuda) {
  namespace fs = std::filesystem;
  const fs::path root =
      fs::temp_directory_path() / ("mt_cuda_resnet_" + std::to_string(::getpid()));
  fs::create_directories(root / "images");
  for (const auto& [split, n] : {std::pair<std::string, uint32_t>{"train", 256}, {"t10k", 64}}) {
    std::vector<uint8_t> pixels(size_t{n} * 28 * 28), labels(n);
    for (size_t i = 0; i < pixels.size(); ++i)
      pixels[i] = static_cast<uint8_t>((i * 37) ^ (i / 97));
    for (uint32_t i = 0; i < n; ++i) labels[i] = static_cast<uint8_t>(i % 10);
    std::ofstream(root / "images" / (split + "-images-idx3-ubyte"), std::ios::binary)
        << data::idx_files::idx_u8({n, 28, 28}, pixels);
    std::ofstream(root / "images" / (split + "-labels-idx1-ubyte"), std::ios::binary)
        << data::idx_files::idx_u8({n}, labels);
  }
  auto run = [&](const std::string& device) {
    runtime::TrainConfig c =
        runtime::load_config(MESHTRAIN_SOURCE_DIR "/configs/fashion_resnet.toml");
    c.model.resnet = "tiny";
    c.data.image_dir = (root / "images").string();
    c.data.batch_size = 32;
    c.data.val_batches = 2;
    c.train.steps = 10;
    c.train.eval_interval = 0;
    c.train.log_interval = 1;
    c.train.threads = 1;
    c.train.label_smoothing = 0.1;  // the recipe's variant; the device's cross-entropy smooths
    c.optim.warmup_steps = 2;
    c.train.device = device;
    c.train.out_dir = (root / device).string();
    runtime::Trainer trainer(c, {});
    return trainer.run();
  };
  const runtime::TrainResult cpu = run("cpu");
  const runtime::TrainResult dev = run("cuda");
  EXPECT_TRUE(losses_close(dev.train_losses, cpu.train_losses));
  EXPECT_NE(dev.sample.find("test accuracy"), std::string::npos) << dev.sample;
  fs::remove_all(root);
}

}  // namespace
}  // namespace meshtrain
