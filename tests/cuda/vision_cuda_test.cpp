// The vision layers on a real GPU (cuDNN's convolutions, meshtrain/cuda/kernels/vision.cu)
// against the CPU, through the autograd ops and the cuda kernel table: outputs, every gradient and
// batch norm's running statistics within tolerances that follow from the arithmetic (summation
// order: products in f32 without TF32, per-channel sums in double); max pooling, ReLU and the
// pooling backwards exactly. Skipped, with the reason, where the process has no device.
#include <gtest/gtest.h>

#include "tests/support/capability.h"

#if MESHTRAIN_HAVE_CUDA

#include <cmath>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "cuda_test_util.h"
#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/vision.h"
#include "meshtrain/cuda/caching_allocator.h"
#include "meshtrain/cuda/kernels/conv2d.h"
#include "meshtrain/cuda/kernels/vision.h"
#include "meshtrain/tensor/cpu/pool2d.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tiny_resnet_training.h"

namespace meshtrain {
namespace {

using test::all_close;

const Device kDev = Device::cuda(0);

// cuDNN is loaded when a convolution first runs on a device, not linked: without a device, and
// on a host without the library, its version is one line naming the library to install.
TEST(CudnnLibrary, LoadsOrSaysWhatIsMissingWithoutADevice) {
  const std::string v = cuda::cudnn_version();
  EXPECT_TRUE(v.starts_with("cuDNN 9.") ||
              (v.starts_with("no cuDNN: ") && v.find("libcudnn.so.9") != std::string::npos))
      << v;
  std::cout << v << "\n";
}

class CudaVision : public ::testing::Test {
 protected:
  void SetUp() override { MT_REQUIRE_CUDA_DEVICE(); }
};

// Runs `f` on copies of `inputs` on `device` (each requiring a gradient) and returns its output
// followed by every input's gradient for the seed gradient `probe` (random, the same on both
// sides).
std::vector<std::vector<float>> run(Device device, const std::vector<Tensor>& inputs,
                                    const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  std::vector<Tensor> xs;
  for (const Tensor& t : inputs) xs.push_back(t.to(device).set_requires_grad(true));
  const Tensor out = f(xs);
  Generator gen(99);
  const Tensor probe = randn(out.shape(), gen).to(device);
  autograd::backward(out, probe);
  std::vector<std::vector<float>> r{out.to_vector()};
  for (const Tensor& x : xs) r.push_back(x.grad().to_vector());
  return r;
}

void expect_close(const std::vector<std::vector<float>>& got,
                  const std::vector<std::vector<float>>& want, double rtol, double atol,
                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    EXPECT_TRUE(all_close(got[i], want[i], rtol, atol)) << what << ", result " << i;
}

TEST_F(CudaVision, ConvolutionsMatchTheCpu) {
  std::cout << "convolutions by " << cuda::cudnn_version() << "\n";
  struct Case {
    Shape x, w;
    autograd::Conv2dOptions o;
  };
  const Case cases[] = {
      {{2, 3, 9, 9}, {4, 3, 3, 3}, {.padding = 1}},
      {{2, 3, 11, 10}, {5, 3, 3, 3}, {.stride = 2, .padding = 1, .dilation = 2}},
      {{3, 4, 8, 8}, {6, 2, 3, 3}, {.padding = 1, .groups = 2}},
      {{2, 8, 7, 7}, {16, 8, 1, 1}, {.stride = 2}},
      {{2, 1, 28, 28}, {16, 1, 3, 3}, {.padding = 1}},
  };
  for (const Case& c : cases) {
    Generator gen(static_cast<uint64_t>(c.x[1] * 100 + c.w[0]));
    const std::vector<Tensor> in{randn(c.x, gen), randn(c.w, gen), randn({c.w[0]}, gen)};
    auto f = [&](const std::vector<Tensor>& t) { return autograd::conv2d(t[0], t[1], t[2], c.o); };
    expect_close(run(kDev, in, f), run(Device::cpu(), in, f), 1e-4, 1e-4,
                 "conv x" + shape_str(c.x) + " w" + shape_str(c.w));
  }
}

TEST_F(CudaVision, BatchNormMatchesTheCpuInTrainingAndEvaluation) {
  for (const bool training : {true, false}) {
    Generator gen(7);
    const std::vector<Tensor> in{randn({4, 3, 5, 6}, gen), randn({3}, gen), randn({3}, gen)};
    const Tensor rm = randn({3}, gen), rv = ops::affine(randn({3}, gen), 0.1f, 1.0f);
    std::vector<float> stats[2];
    std::vector<std::vector<float>> results[2];
    for (int side = 0; side < 2; ++side) {
      const Device d = side == 0 ? kDev : Device::cpu();
      Tensor m = rm.to(d), v = rv.to(d);
      results[side] = run(d, in, [&](const std::vector<Tensor>& t) {
        return autograd::batch_norm(t[0], t[1], t[2], m, v, training, 0.1, 1e-5);
      });
      stats[side] = m.to_vector();
      for (const float x : v.to_vector()) stats[side].push_back(x);
    }
    expect_close(results[0], results[1], 1e-5, 1e-5, training ? "training" : "evaluation");
    EXPECT_TRUE(all_close(stats[0], stats[1], 1e-6, 1e-6)) << "running statistics";
  }
}

TEST_F(CudaVision, PoolingAndReluMatchTheCpu) {
  Generator gen(5);
  std::vector<float> values = randn({2, 3, 9, 8}, gen).to_vector();
  values[7] = std::numeric_limits<float>::quiet_NaN();  // NaN wins its windows, as in PyTorch
  values[20] = 0.0f;
  values[60] = -0.0f;  // relu keeps the sign of a zero, as the CPU's (x < 0 ? 0 : x)
  const std::vector<Tensor> in{Tensor::from_vector(values, {2, 3, 9, 8})};
  using F = std::function<Tensor(const std::vector<Tensor>&)>;
  const std::vector<std::pair<std::string, F>> ops = {
      {"max 3/2/1", [](const auto& t) { return autograd::max_pool2d(t[0], 3, 2, 1); }},
      {"max 2", [](const auto& t) { return autograd::max_pool2d(t[0], 2); }},
      {"avg 3/2/1", [](const auto& t) { return autograd::avg_pool2d(t[0], 3, 2, 1); }},
      {"avg 3/2/1 without padding",
       [](const auto& t) { return autograd::avg_pool2d(t[0], 3, 2, 1, false); }},
      {"global", [](const auto& t) { return autograd::global_avg_pool(t[0]); }},
      {"relu", [](const auto& t) { return autograd::relu(t[0]); }},
  };
  for (const auto& [name, f] : ops) {
    const bool exact = name.starts_with("max") || name == "relu";
    const auto gpu = run(kDev, in, f), cpu = run(Device::cpu(), in, f);
    expect_close(gpu, cpu, exact ? 0.0 : 1e-6, exact ? 0.0 : 1e-6, name);
    if (name == "relu") {
      EXPECT_TRUE(std::signbit(gpu[0][60]) && gpu[0][60] == 0.0f) << gpu[0][60];
      EXPECT_TRUE(std::signbit(cpu[0][60])) << "the CPU reference changed";
    }
  }
}

// What a rank with no samples, or a plane with no positions, computes: the CPU's zeros (the
// device once threw in cuDNN for an empty batch's weight gradient, and averaged 0/0 to NaN).
TEST_F(CudaVision, EmptyInputsGiveTheCpusZeros) {
  const cudaStream_t stream = cuda::current_stream(0);
  cpu::Conv2dShape s{.N = 0, .C_in = 3, .H = 8, .W = 8, .C_out = 4, .KH = 3, .KW = 3};
  const std::vector<float> nans(4 * 3 * 3 * 3, std::numeric_limits<float>::quiet_NaN());
  Tensor dw = Tensor::from_vector(nans, {4, 3, 3, 3}).to(kDev);
  Tensor db = Tensor::from_vector(std::vector<float>(4, nans[0]), {4}).to(kDev);
  Tensor none = Tensor::empty({0}, DType::f32, kDev);
  cuda::conv2d_backward_weights(static_cast<float*>(dw.data_ptr()),
                                static_cast<float*>(db.data_ptr()),
                                static_cast<const float*>(none.data_ptr()),
                                static_cast<const float*>(none.data_ptr()), s, stream);
  EXPECT_EQ(dw.to_vector(), std::vector<float>(nans.size(), 0.0f));
  EXPECT_EQ(db.to_vector(), std::vector<float>(4, 0.0f));
  // A kernel larger than the padded input: no output position, so the input gets zeros.
  s = {.N = 2, .C_in = 3, .H = 2, .W = 2, .C_out = 4, .KH = 3, .KW = 3};
  Tensor dx = Tensor::from_vector(std::vector<float>(2 * 3 * 2 * 2, nans[0]), {24}).to(kDev);
  Tensor w = Tensor::from_vector(std::vector<float>(nans.size(), 1.0f), {108}).to(kDev);
  cuda::conv2d_backward_data(static_cast<float*>(dx.data_ptr()),
                             static_cast<const float*>(none.data_ptr()),
                             static_cast<const float*>(w.data_ptr()), s, stream);
  EXPECT_EQ(dx.to_vector(), std::vector<float>(24, 0.0f));
  Tensor pooled = Tensor::from_vector(std::vector<float>(6, nans[0]), {6}).to(kDev);
  cuda::global_avg_pool_forward(static_cast<float*>(pooled.data_ptr()),
                                static_cast<const float*>(none.data_ptr()), 2, 3, 0, stream);
  std::vector<float> want(6, nans[0]);
  cpu::global_avg_pool_forward(want.data(), nullptr, 2, 3, 0);
  EXPECT_EQ(pooled.to_vector(), want);
  EXPECT_EQ(want, std::vector<float>(6, 0.0f));
}

TEST_F(CudaVision, AResNetTrainsOnTheGpuLikeOnTheCpu) {
  for (const bool sgd : {false, true}) {
    // The recipe's SGD with label smoothing (its documented variant), AdamW without.
    const test::TinyResNetRun run{
        .steps = 5, .batch = 8, .image = 28, .sgd = sgd, .label_smoothing = sgd ? 0.1f : 0.0f};
    const std::vector<float> gpu = test::train_tiny_resnet(kDev, run);
    const std::vector<float> cpu = test::train_tiny_resnet(Device::cpu(), run);
    EXPECT_TRUE(all_close(gpu, cpu, 1e-3, 1e-3)) << (sgd ? "sgd" : "adamw");
  }
}

}  // namespace
}  // namespace meshtrain

#else

TEST(CudaVision, BuiltWithoutCuda) {
  MT_SKIP_UNLESS("cuda", false, "built without CUDA: the GPU vision tests are not compiled");
}

#endif
