// The ResNet against torch.nn (Debian's python3-torch; tests/python/resnet_torch.py writes it with
// torchvision's module names and structure, torchvision itself not being packaged):
//  - the weights `meshtrain train` writes after a few steps of the tiny ResNet load into the
//    PyTorch model with load_state_dict(strict=True), running statistics and num_batches_tracked
//    included, names, shapes and dtypes all as the PyTorch model has them; on those weights the
//    evaluation-mode logits of a batch of images, one training-mode forward's logits, loss and
//    gradients, and the running statistics that forward updates match ours (a test-side
//    nn::ResNet loaded from the same file);
//  - the same on random weights for a ResNet with the ImageNet stem (7x7 stride-2 convolution, max
//    pool) and bottleneck blocks, which the tiny one does not have;
//  - every named config (small, tiny, resnet18, resnet50) has torchvision's state dict: the same
//    names, shapes and dtypes (resnet18 and resnet50 are torchvision's own).
// Tolerance: both sides compute in f32 with different summation orders. Measured: logits, loss
// and running statistics differ by at most ~5e-7 of the compared tensor's largest magnitude,
// gradients by ~5e-6 (they pass backward through every batch norm's division by the batch
// deviation); asserted: 2e-5 and 2e-4, some 40x above that. A difference of convention is far
// larger (measured by changing the PyTorch side): every batch norm's eps 1e-4 instead of 1e-5
// moves the evaluation logits by 1e-4 and the training-mode ones by 8e-4 of their scale; one
// momentum of 0.2 instead of 0.1 moves a running mean by ~1 of its scale; the ImageNet stem
// without its max pool moves the logits by 1e-2; a padding of 0 changes the shapes, and a
// renamed module stops the load.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <tuple>
#include <vector>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/data/image_batches.h"
#include "meshtrain/data/image_set.h"
#include "meshtrain/nn/resnet.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tests/optim/torch_reference.h"
#include "tests/runtime/band_images.h"
#include "tests/runtime/train_run_fixture.h"
#include "tests/support/capability.h"
#include "tests/support/run_command.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain {
namespace {

namespace fs = std::filesystem;
using testing::CommandResult;
using testing::run_command;

// Relative to the compared tensor's largest magnitude (see the top comment).
constexpr float kValues = 2e-5f;
constexpr float kGradients = 2e-4f;

const std::string kReference =
    std::string(MESHTRAIN_SOURCE_DIR) + "/tests/python/resnet_reference.py";

float largest_magnitude(const Tensor& t) {
  float m = 0;
  for (float v : t.to_vector()) m = std::max(m, std::fabs(v));
  return m;
}

// Asserts |got - want| <= rel * max|want| and returns the relative difference.
float expect_close(const Tensor& got, const Tensor& want, float rel, const std::string& what) {
  EXPECT_TRUE(got.defined()) << what;
  if (!got.defined()) return INFINITY;
  EXPECT_EQ(got.shape(), want.shape()) << what;
  if (got.shape() != want.shape()) return INFINITY;
  const float scale = std::max(largest_magnitude(want), 1e-12f);
  const float diff = testing::largest_difference(got, want) / scale;
  EXPECT_LE(diff, rel) << what << ": largest difference " << diff << " of the scale " << scale;
  return diff;
}

class ResNetTorchParity : public testing::TrainRunTest {
 protected:
  void SetUp() override {
    MT_SKIP_UNLESS("torch", optim::testing::torch_available(),
                   optim::testing::kSystemPython << " cannot import torch (python3-torch)");
    TrainRunTest::SetUp();
  }

  // Runs the reference on `weights` (a safetensors file of `net`'s state dict) and compares:
  // evaluation logits of x_eval, then one training-mode forward and backward of (x_train,
  // y_train) with the running statistics it updates. `spec` names the PyTorch model (a config
  // name or resnet_torch.ResNet's arguments as JSON). Prints the largest relative differences.
  void compare(nn::ResNet& net, const std::string& spec, const fs::path& weights,
               const Tensor& x_eval, const Tensor& x_train, const Tensor& y_train) {
    const fs::path inputs = dir_ / "inputs.safetensors", out = dir_ / "reference.safetensors";
    ckpt::save_safetensors(inputs.string(),
                           {{"x_eval", x_eval}, {"x_train", x_train}, {"y_train", y_train}});
    const std::string cmd = optim::testing::python_command() + " " + kReference + " --config '" +
                            spec + "' --num-classes " + std::to_string(net.config().num_classes) +
                            " --weights " + weights.string() + " --inputs " + inputs.string() +
                            " --output " + out.string();
    const CommandResult r = run_command(cmd);
    ASSERT_EQ(r.status, 0) << cmd << "\n" << r.output;
    const ckpt::SafetensorsFile ref = ckpt::load_safetensors(out.string());

    std::map<std::string, float> worst;  // by kind of tensor
    auto note = [&](const std::string& kind, float d) { worst[kind] = std::max(worst[kind], d); };
    net.eval();
    {
      autograd::NoGradGuard no_grad;
      note("eval logits",
           expect_close(net.forward(x_eval), ref.at("logits_eval"), kValues, "evaluation logits"));
    }
    net.train();
    const Tensor logits = net.forward(x_train);
    const Tensor loss = autograd::cross_entropy(logits, y_train, -1);
    autograd::backward(loss);
    note("train logits",
         expect_close(logits, ref.at("logits_train"), kValues, "training-mode logits"));
    const float want_loss = ref.at("loss").item();
    EXPECT_LE(std::fabs(loss.item() - want_loss), kValues * std::fabs(want_loss)) << "loss";
    note("loss", std::fabs(loss.item() - want_loss) / std::fabs(want_loss));
    for (const auto& [name, p] : net.named_parameters())
      note("gradients", expect_close(p.grad(), ref.at(name + ".grad"), kGradients, name + ".grad"));
    for (const auto& [name, b] : net.named_buffers()) {
      if (b.dtype() == DType::i64) {
        EXPECT_EQ(b.item(), ref.at(name).item()) << name;
      } else {
        note("running statistics", expect_close(b, ref.at(name), kValues, name));
      }
    }
    for (const auto& [kind, d] : worst)
      std::printf("%-20s largest difference %.3g of the scale\n", kind.c_str(), d);
  }
};

// The weights a training run wrote, as they are: the file goes to PyTorch untouched.
TEST_F(ResNetTorchParity, TrainedTinyResNetLoadsIntoTorchAndComputesTheSame) {
  const fs::path images = dir_ / "images", run = dir_ / "run";
  fs::create_directories(images);
  testing::write_band_images(images, "train", 96, 1);
  testing::write_band_images(images, "t10k", 24, 2);
  constexpr int kSteps = 5;
  const CommandResult r = run_command(
      testing::kMeshtrainBin +
      " train --set model.kind=resnet --set model.resnet=tiny --set data.kind=fashion_mnist"
      " --set data.image_dir=" +
      images.string() + " --set train.out_dir=" + run.string() +
      " --set optim.name=sgd --set optim.lr=0.05 --set optim.schedule=constant"
      " --set optim.warmup_steps=0 --set data.batch_size=8 --set train.threads=1"
      " --set train.eval_interval=0 --set data.val_batches=1 --set train.steps=" +
      std::to_string(kSteps));
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path weights = run / "model.safetensors";
  const ckpt::SafetensorsFile file = ckpt::load_safetensors(weights.string());
  ASSERT_TRUE(file.contains("layer2.0.downsample.1.running_var"));
  // Trained: the running statistics moved, and every batch norm counted each step's batch.
  EXPECT_EQ(file.at("layer3.0.bn2.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(file.at("layer3.0.bn2.num_batches_tracked").item(), kSteps);

  nn::ResNet net(nn::resnet_config("tiny", 1, 10));
  std::map<std::string, Tensor> state(file.tensors.begin(), file.tensors.end());
  net.load_state_dict(state, /*strict=*/true);

  // Real inputs: the test split as evaluation reads it, and training images normalised.
  const data::ImageSet test = data::load_fashion_mnist(images.string(), "test");
  const data::ImageSet train = data::load_fashion_mnist(images.string(), "train");
  const data::ImageTransform plain(data::fashion_mnist_transform(false), 1);
  const auto [x_eval, y_eval] = plain.slice(test, 0, test.size());
  const auto [x_train, y_train] = plain.slice(train, 0, 16);
  compare(net, "tiny", weights, x_eval, x_train, y_train);
}

// What the tiny ResNet lacks: the ImageNet stem and bottleneck blocks (stride on the 3x3, the
// shortcut's 1x1 convolution on every first block), on random weights and batch-norm state.
TEST_F(ResNetTorchParity, ImageNetStemAndBottleneckMatchTorch) {
  nn::ResNetConfig c;
  c.block = nn::ResNetConfig::Block::bottleneck;
  c.blocks = {1, 2};
  c.width = 4;
  c.in_channels = 3;
  c.num_classes = 5;
  c.imagenet_stem = true;
  c.seed = 3;
  nn::ResNet net(c);
  Generator gen(7);
  for (const auto& [name, bn] : net.batch_norms()) {
    const int64_t n = bn->weight().numel();
    Tensor(bn->weight()).copy_(ops::affine(randn({n}, gen), 0.3f, 1.0f));
    Tensor(bn->bias()).copy_(ops::affine(randn({n}, gen), 0.3f, 0.0f));
    Tensor(bn->running_mean()).copy_(ops::affine(randn({n}, gen), 0.2f, 0.0f));
    Tensor var = bn->running_var();
    uniform_(var, gen, 0.5, 1.5);
  }
  const fs::path weights = dir_ / "random.safetensors";
  ckpt::save_safetensors(weights.string(), net.state_dict());
  // Shifted and scaled: the batch statistics differ from the running ones.
  const Tensor x_eval = ops::affine(randn({3, 3, 32, 32}, gen), 1.5f, 0.5f);
  const Tensor x_train = ops::affine(randn({4, 3, 32, 32}, gen), 1.5f, 0.5f);
  const Tensor y_train = Tensor::from_vector(std::vector<int32_t>{0, 3, 1, 4}, {4});
  compare(net,
          R"({"block": "bottleneck", "blocks": [1, 2], "width": 4, "in_channels": 3,)"
          R"( "num_classes": 5, "imagenet_stem": true})",
          weights, x_eval, x_train, y_train);
}

TEST_F(ResNetTorchParity, EveryNamedConfigHasTorchvisionsStateDict) {
  for (const auto& [name, channels, classes] :
       {std::tuple<std::string, int64_t, int64_t>{"small", 1, 10},
        {"tiny", 1, 10},
        {"resnet18", 3, 1000},
        {"resnet50", 3, 1000}}) {
    SCOPED_TRACE(name);
    const CommandResult r = run_command(
        optim::testing::python_command() + " " + kReference + " --describe " + name +
        " --in-channels " + std::to_string(channels) + " --num-classes " + std::to_string(classes));
    ASSERT_EQ(r.status, 0) << r.output;
    // The answer is the last line (anything torch warns comes before it).
    std::string line = r.output.substr(0, r.output.find_last_not_of('\n') + 1);
    line = line.substr(line.find_last_of('\n') + 1);
    const auto want = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(want.is_object()) << r.output;
    const nn::ResNet net(nn::resnet_config(name, channels, classes));
    const nn::NamedTensors state = net.state_dict();
    EXPECT_EQ(state.size(), want.size());
    int64_t params = 0;
    for (const auto& [tname, t] : state) {
      ASSERT_TRUE(want.contains(tname)) << tname << " is not in torchvision's state dict";
      const std::string dtype = t.dtype() == DType::i64 ? "int64" : "float32";
      EXPECT_EQ(want[tname][0].get<std::string>(), dtype) << tname;
      EXPECT_EQ(want[tname][1].get<std::vector<int64_t>>(), t.shape()) << tname;
    }
    for (const auto& [pname, p] : net.named_parameters()) params += p.numel();
    // torchvision's own counts.
    if (name == "resnet18") {
      EXPECT_EQ(params, 11689512);
    } else if (name == "resnet50") {
      EXPECT_EQ(params, 25557032);
    }
  }
}

}  // namespace
}  // namespace meshtrain
