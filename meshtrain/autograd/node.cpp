#include "meshtrain/autograd/node.h"

#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/tensor/ops.h"

namespace meshtrain::autograd {
namespace {
std::atomic<uint64_t> g_next_sequence_nr{0};
}

Node::Node() : sequence_nr_(g_next_sequence_nr.fetch_add(1, std::memory_order_relaxed)) {}

AccumulateGrad::AccumulateGrad(Tensor variable) : variable_(std::move(variable)) {
  output_dtypes().push_back(variable_.dtype());
}

std::vector<Tensor> AccumulateGrad::apply(std::vector<Tensor>&& grads) {
  Tensor& g = grads[0];
  AutogradMeta& meta = variable_.autograd_meta();
  if (!meta.grad.defined()) {
    // Take ownership when nobody else can see the buffer (no other handle on the tensor, as a
    // gradient the caller passed to backward and still holds, nor on its storage); copy
    // otherwise, so that a later in-place accumulation never writes into another tensor.
    meta.grad = g.uniquely_held() ? g.view(variable_.shape()) : g.clone().view(variable_.shape());
  } else {
    ops::add_(meta.grad, g);
  }
  for (auto& hook : meta.grad_ready_hooks) hook(variable_);
  return {};
}

std::vector<Tensor> LambdaNode::apply(std::vector<Tensor>&& grads) {
  MT_CHECK(backward_ != nullptr, "backward through '", name_,
           "' a second time: its saved tensors were freed (use retain_graph)");
  return backward_(std::move(grads));
}

Edge gradient_edge(const Tensor& t) {
  if (!t.defined() || !t.requires_grad()) return {};
  AutogradMeta& meta = t.autograd_meta();
  if (meta.grad_fn) return {meta.grad_fn, meta.output_nr};
  std::shared_ptr<Node> acc = meta.grad_accumulator.lock();
  if (!acc) {
    acc = std::make_shared<AccumulateGrad>(t);
    meta.grad_accumulator = acc;
  }
  return {acc, 0};
}

bool any_requires_grad(std::initializer_list<const Tensor*> inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

bool any_requires_grad(const std::vector<Tensor>& inputs) {
  if (!grad_enabled()) return false;
  for (const Tensor& t : inputs)
    if (t.defined() && t.requires_grad()) return true;
  return false;
}

void set_history(const std::shared_ptr<Node>& node, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor*>& outputs) {
  auto& edges = node->next_edges();
  edges.clear();
  edges.reserve(inputs.size());
  for (const Tensor& t : inputs) edges.push_back(gradient_edge(t));
  node->set_num_outputs(static_cast<uint32_t>(outputs.size()));
  auto& shapes = node->output_shapes();
  auto& devices = node->output_devices();
  auto& dtypes = node->output_dtypes();
  shapes.clear();
  devices.clear();
  dtypes.clear();
  for (uint32_t i = 0; i < outputs.size(); ++i) {
    Tensor* out = outputs[i];
    shapes.push_back(out->shape());
    devices.push_back(out->device());
    dtypes.push_back(out->dtype());
    AutogradMeta& meta = out->autograd_meta();
    meta.requires_grad = true;
    meta.grad_fn = node;
    meta.output_nr = i;
  }
}

void record(const std::string& name, const std::vector<Tensor>& inputs, Tensor& output,
            LambdaNode::Backward backward) {
  if (!any_requires_grad(inputs)) return;
  auto node = std::make_shared<LambdaNode>(name, std::move(backward));
  set_history(node, inputs, {&output});
}

}  // namespace meshtrain::autograd
