#include "meshtrain/autograd/function.h"

#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/node.h"

namespace meshtrain::autograd {
namespace {

class FunctionNode final : public Node {
 public:
  explicit FunctionNode(std::shared_ptr<Function> fn) : fn_(std::move(fn)) {}
  std::vector<Tensor> apply(std::vector<Tensor>&& grads) override {
    MT_CHECK(fn_ != nullptr, "backward through custom function a second time");
    std::vector<Tensor> r = fn_->backward(grads);
    MT_CHECK(r.size() == next_edges().size(), "custom function '", fn_->name(), "' returned ",
             r.size(), " gradients for ", next_edges().size(), " inputs");
    return r;
  }
  std::string name() const override { return fn_ ? fn_->name() : "Function(released)"; }
  void release() override { fn_.reset(); }

 private:
  std::shared_ptr<Function> fn_;
};

}  // namespace

std::vector<Tensor> Function::apply(std::shared_ptr<Function> fn,
                                    const std::vector<Tensor>& inputs) {
  const bool needs_grad = any_requires_grad(inputs);
  std::vector<Tensor> outputs;
  {
    NoGradGuard guard;
    outputs = fn->forward(inputs);
  }
  if (!needs_grad) return outputs;
  // Outputs share storage with nothing recorded: detach so that each gets its own metadata.
  std::vector<Tensor*> outs;
  for (Tensor& t : outputs) {
    t = t.detach();
    outs.push_back(&t);
  }
  auto node = std::make_shared<FunctionNode>(std::move(fn));
  set_history(node, inputs, outs);
  return outputs;
}

}  // namespace meshtrain::autograd
