// The external check of the vision layers' conventions: a small network of Conv2d, BatchNorm2d,
// ReLU and the pooling ops, run once in training mode (forward, backward, running statistics) and
// once in evaluation mode, must match torch.nn on the same weights and input (Debian's
// python3-torch). Both sides compute in float with different summation orders, so values agree to
// ~1e-6 of their scale; 2e-5 is asserted. PyTorch's convolutions run through oneDNN too, but the
// reference implementation is checked the same way, so the comparison is not of a library with
// itself.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "meshtrain/autograd/engine.h"
#include "meshtrain/autograd/functional.h"
#include "meshtrain/autograd/ops.h"
#include "meshtrain/autograd/vision.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/nn/batch_norm.h"
#include "meshtrain/nn/conv2d.h"
#include "meshtrain/tensor/cpu/conv2d.h"
#include "meshtrain/tensor/ops.h"
#include "meshtrain/tensor/random.h"
#include "tests/support/capability.h"
#include "tests/support/tensor_compare.h"

namespace meshtrain {
namespace {

constexpr const char* kPython = "/usr/bin/python3";

bool torch_available() {
  return std::system((std::string(kPython) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
}

struct Net {
  Generator gen{5};
  nn::Conv2d c1{3, 8, 3, {.stride = 2, .padding = 1, .bias = false}, gen};
  nn::BatchNorm2d bn1{8};
  nn::Conv2d c2{8, 8, 3, {.padding = 2, .dilation = 2, .groups = 2}, gen};
  nn::BatchNorm2d bn2{8, {.momentum = 0.2}};

  std::vector<std::pair<std::string, nn::Module*>> layers() {
    return {{"c1", &c1}, {"bn1", &bn1}, {"c2", &c2}, {"bn2", &bn2}};
  }
  Tensor forward(const Tensor& x) {
    Tensor h = autograd::relu(bn1.forward(c1.forward(x)));
    h = autograd::max_pool2d(h, 3, 2, 1);
    // Batch norm before the biased convolution: after it, the bias would get a zero gradient.
    h = autograd::relu(c2.forward(bn2.forward(h)));
    h = autograd::avg_pool2d(h, 3, 2, 1, false);
    return autograd::global_avg_pool(h);
  }
  void train(bool on) {
    for (auto& [name, m] : layers()) m->train(on);
  }
};

void expect_close(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.defined()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  float scale = 0.0f;
  for (float v : want.to_vector()) scale = std::max(scale, std::fabs(v));
  EXPECT_LE(testing::largest_difference(got, want), 2e-5f * scale) << what;
}

struct Outcome {
  Tensor y, x_grad, y_eval;
  nn::NamedTensors grads, buffers;
};

// One training step's forward and backward, then an evaluation forward, on the implementation
// `impl`, from the weights in `init`.
Outcome run_ours(cpu::ConvImpl impl, const std::map<std::string, Tensor>& init, const Tensor& x,
                 const Tensor& r) {
  cpu::ScopedConvImpl scoped(impl);
  Net net;
  for (auto& [name, m] : net.layers()) {
    std::map<std::string, Tensor> state;
    for (auto& [tname, t] : m->state_dict()) state[tname] = init.at(name + "." + tname);
    m->load_state_dict(state);
  }
  Outcome o;
  Tensor xg = x.clone().set_requires_grad(true);
  o.y = net.forward(xg);
  autograd::backward(autograd::sum_all(autograd::mul(o.y, r)));
  o.x_grad = xg.grad();
  for (auto& [name, m] : net.layers()) {
    for (auto& [pname, p] : m->named_parameters())
      o.grads.emplace_back(name + "." + pname + ".grad", p.grad());
    for (auto& [bname, b] : m->named_buffers()) o.buffers.emplace_back(name + "." + bname, b);
  }
  net.train(false);
  o.y_eval = net.forward(x);
  return o;
}

TEST(TorchParity, VisionNetworkMatchesTorchNnOnBothConvolutions) {
  MT_SKIP_UNLESS("torch", torch_available(), kPython << " cannot import torch (python3-torch)");
  const auto dir =
      std::filesystem::temp_directory_path() / ("mt_vision_parity_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  Generator gen(11);
  // Shifted and scaled so that the batch statistics are far from the initial running ones.
  const Tensor x = ops::affine(randn({4, 3, 10, 10}, gen), 2.0f, 0.5f);
  const Tensor r = randn({4, 8}, gen);
  Net init_net;
  // Batch-norm weights and biases away from 1 and 0: with bias 0 the ReLU and max pool after bn1
  // commute with its scale, which bn2 then normalises away, leaving bn1.weight no gradient.
  for (nn::BatchNorm2d* bn : {&init_net.bn1, &init_net.bn2}) {
    Tensor w = bn->weight(), b = bn->bias();
    w.copy_(ops::affine(randn({8}, gen), 0.3f, 1.0f));
    b.copy_(ops::affine(randn({8}, gen), 0.5f, 0.0f));
  }
  std::map<std::string, Tensor> init;
  nn::NamedTensors saved = {{"x", x}, {"r", r}};
  for (auto& [name, m] : init_net.layers())
    for (auto& [tname, t] : m->state_dict()) {
      init[name + "." + tname] = t.clone();
      saved.emplace_back(name + "." + tname, t.clone());
    }
  ckpt::save_safetensors((dir / "in.safetensors").string(), saved);
  const std::string cmd = std::string(kPython) + " " + MESHTRAIN_SOURCE_DIR +
                          "/tests/python/vision_reference.py --inputs " +
                          (dir / "in.safetensors").string() + " --output " +
                          (dir / "out.safetensors").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const ckpt::SafetensorsFile ref = ckpt::load_safetensors((dir / "out.safetensors").string());
  std::filesystem::remove_all(dir);

  for (cpu::ConvImpl impl : {cpu::ConvImpl::onednn, cpu::ConvImpl::reference}) {
    SCOPED_TRACE(impl == cpu::ConvImpl::onednn ? "oneDNN" : "reference");
    const Outcome o = run_ours(impl, init, x, r);
    expect_close(o.y, ref.at("y"), "y");
    expect_close(o.x_grad, ref.at("x.grad"), "x.grad");
    expect_close(o.y_eval, ref.at("y_eval"), "y_eval");
    for (const auto& [name, g] : o.grads) expect_close(g, ref.at(name), name);
    for (const auto& [name, b] : o.buffers) {
      if (b.dtype() == DType::i64) {
        EXPECT_EQ(b.item(), ref.at(name).item()) << name;
        EXPECT_EQ(b.item(), 1.0f) << name;
      } else {
        expect_close(b, ref.at(name), name);
      }
    }
    EXPECT_EQ(o.grads.size(), 7u);  // c1.weight, bn1.{weight,bias}, c2.{weight,bias}, bn2.{..}
    EXPECT_EQ(o.buffers.size(), 6u);
  }
}

}  // namespace
}  // namespace meshtrain
