#include "meshtrain/autograd/engine.h"

#include <functional>
#include <queue>
#include <unordered_map>

#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/node.h"
#include "meshtrain/tensor/ops.h"

namespace meshtrain::autograd {
namespace {

struct PendingInputs {
  std::vector<Tensor> grads;
};

// pending_input_gradient for the node whose backward runs in this thread (null outside one): one
// lookup per pass, set around each node's backward and restored after (a backward may run a pass
// of its own).
using PendingInputLookup = std::function<Tensor(size_t, const Shape&, Device)>;
thread_local const PendingInputLookup* g_pending_input = nullptr;

class PendingInputGradients {
 public:
  explicit PendingInputGradients(const PendingInputLookup& lookup) : prev_(g_pending_input) {
    g_pending_input = &lookup;
  }
  ~PendingInputGradients() { g_pending_input = prev_; }
  PendingInputGradients(const PendingInputGradients&) = delete;
  PendingInputGradients& operator=(const PendingInputGradients&) = delete;

 private:
  const PendingInputLookup* prev_;
};

// Whether the backward pass running in this thread frees each node's saved tensors after it.
thread_local bool g_releasing_saved = false;

class ReleasingSaved {
 public:
  explicit ReleasingSaved(bool releasing) : prev_(g_releasing_saved) {
    g_releasing_saved = releasing;
  }
  ~ReleasingSaved() { g_releasing_saved = prev_; }
  ReleasingSaved(const ReleasingSaved&) = delete;
  ReleasingSaved& operator=(const ReleasingSaved&) = delete;

 private:
  bool prev_;
};

struct LaterFirst {
  bool operator()(const Node* a, const Node* b) const {
    return a->sequence_nr() < b->sequence_nr();
  }
};

}  // namespace

namespace {

// One backward pass. With `capture` (gradient edges, one per requested input), the gradient
// that reaches each captured edge is returned instead of being passed on: the walk stops there,
// so neither the captured node nor anything behind it runs.
std::vector<Tensor> run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                                 BackwardOptions options, const std::vector<Edge>& capture) {
  MT_CHECK(roots.size() == grads.size(), "backward: ", roots.size(), " roots but ", grads.size(),
           " gradients");
  // Gradients are never themselves recorded (no higher-order derivatives).
  NoGradGuard no_grad;
  const ReleasingSaved releasing(!options.retain_graph);

  std::unordered_map<Node*, PendingInputs> pending;
  std::unordered_map<Node*, int> dependencies;
  std::vector<std::shared_ptr<Node>> keep_alive;
  std::unordered_map<Node*, std::vector<size_t>> captured;  // node -> indices into capture
  for (size_t i = 0; i < capture.size(); ++i)
    if (capture[i].fn) captured[capture[i].fn.get()].push_back(i);
  std::vector<Tensor> results(capture.size());

  // Count, for every reachable node, how many edges lead into it.
  std::vector<Node*> stack;
  auto visit = [&](Node* n) {
    if (!captured.count(n)) stack.push_back(n);
  };
  auto visit_root = [&](const Edge& e) {
    if (!e.fn) return;
    if (dependencies.emplace(e.fn.get(), 0).second) {
      visit(e.fn.get());
      keep_alive.push_back(e.fn);
    }
  };
  std::vector<Edge> root_edges;
  for (size_t i = 0; i < roots.size(); ++i) {
    const Tensor& r = roots[i];
    MT_CHECK(r.requires_grad(), "backward: tensor ", i,
             " does not require grad (no parameter contributed to it)");
    Edge e = gradient_edge(r);
    root_edges.push_back(e);
    visit_root(e);
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    for (const Edge& e : n->next_edges()) {
      if (!e.fn) continue;
      auto [it, inserted] = dependencies.emplace(e.fn.get(), 0);
      ++it->second;
      if (inserted) {
        visit(e.fn.get());
        keep_alive.push_back(e.fn);
      }
    }
  }

  // With captured inputs, only nodes from which a captured node can be reached run: the rest
  // would accumulate into .grad of tensors that were not asked for.
  std::unordered_map<Node*, bool> leads_to_capture;
  if (!captured.empty()) {
    std::vector<std::pair<Node*, bool>> order;  // (node, children done)
    for (const Edge& e : root_edges)
      if (e.fn) order.emplace_back(e.fn.get(), false);
    while (!order.empty()) {
      auto [n, children_done] = order.back();
      order.pop_back();
      if (!children_done) {
        if (leads_to_capture.count(n)) continue;
        if (captured.count(n)) {
          leads_to_capture[n] = true;
          continue;
        }
        order.emplace_back(n, true);
        for (const Edge& e : n->next_edges())
          if (e.fn && !leads_to_capture.count(e.fn.get())) order.emplace_back(e.fn.get(), false);
        continue;
      }
      bool any = false;
      for (const Edge& e : n->next_edges()) {
        if (!e.fn) continue;
        auto it = leads_to_capture.find(e.fn.get());
        any = any || (it != leads_to_capture.end() && it->second);
      }
      leads_to_capture[n] = any;
    }
  }
  auto wanted = [&](Node* n) { return captured.empty() || leads_to_capture[n]; };

  auto add_grad = [&](Node* n, uint32_t slot, Tensor g) {
    auto& p = pending[n];
    if (p.grads.size() < n->num_outputs()) p.grads.resize(n->num_outputs());
    // A gradient has its tensor's type: an op that returns another (an f32 gradient for a half
    // input it cannot write in half) is converted here, once.
    const auto& dtypes = n->output_dtypes();
    const DType want = slot < dtypes.size() ? dtypes[slot] : g.dtype();
    if (g.dtype() != want && is_floating(g.dtype()) && is_floating(want)) g = g.to(want);
    Tensor& cur = p.grads[slot];
    if (!cur.defined()) {
      cur = std::move(g);
    } else if (cur.dtype() != DType::f32) {
      // Half gradients are summed in f32 and rounded once, as a half add would.
      Tensor sum = cur.to(DType::f32);
      ops::add_(sum, g.to(DType::f32));
      cur = sum.to(cur.dtype());
    } else if (cur.uniquely_held()) {
      ops::add_(cur, g);
    } else {
      // Another slot or node may hold the same tensor (an addition hands its gradient to both
      // operands): the sum goes to a fresh buffer, the same traffic as summing in place.
      cur = ops::add(cur, g);
    }
  };

  for (size_t i = 0; i < roots.size(); ++i) {
    Tensor g = grads[i];
    if (!g.defined()) {
      MT_CHECK(roots[i].numel() == 1, "backward: a gradient is needed for non-scalar root ",
               roots[i].str());
      g = Tensor::ones(roots[i].shape(), roots[i].dtype(), roots[i].device());
    } else if (g.device() != roots[i].device()) {
      g = g.to(roots[i].device());
    }
    MT_CHECK(g.shape() == roots[i].shape(), "backward: gradient shape ", shape_str(g.shape()),
             " does not match root shape ", shape_str(roots[i].shape()));
    if (root_edges[i].fn) add_grad(root_edges[i].fn.get(), root_edges[i].input_nr, g);
  }

  std::priority_queue<Node*, std::vector<Node*>, LaterFirst> ready;
  for (const Edge& e : root_edges)
    if (e.fn && wanted(e.fn.get()) && dependencies[e.fn.get()] == 0) {
      dependencies[e.fn.get()] = -1;  // queued
      ready.push(e.fn.get());
    }

  // The pending gradient of the running node's input, where the pass alone holds it.
  Node* running = nullptr;
  const PendingInputLookup pending_input = [&](size_t input, const Shape& shape,
                                               Device device) -> Tensor {
    const auto& edges = running->next_edges();
    if (input >= edges.size() || !edges[input].fn || !wanted(edges[input].fn.get())) return {};
    auto it = pending.find(edges[input].fn.get());
    if (it == pending.end() || edges[input].input_nr >= it->second.grads.size()) return {};
    Tensor& cur = it->second.grads[edges[input].input_nr];
    if (!cur.defined() || cur.dtype() != DType::f32 || cur.shape() != shape ||
        cur.device() != device || !cur.uniquely_held())
      return {};
    return cur;
  };

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> inputs = std::move(pending[n].grads);
    pending.erase(n);
    if (auto c = captured.find(n); c != captured.end()) {
      for (size_t i : c->second) {
        const uint32_t slot = capture[i].input_nr;
        if (slot < inputs.size()) results[i] = inputs[slot];
      }
      continue;
    }
    inputs.resize(n->num_outputs());
    for (uint32_t i = 0; i < inputs.size(); ++i) {
      if (!inputs[i].defined()) {
        const auto& shapes = n->output_shapes();
        const auto& devices = n->output_devices();
        MT_CHECK(i < shapes.size() && i < devices.size(), "node ", n->name(),
                 " lacks output shape ", i);
        const auto& dtypes = n->output_dtypes();
        inputs[i] =
            Tensor::zeros(shapes[i], i < dtypes.size() ? dtypes[i] : DType::f32, devices[i]);
      }
    }
    std::vector<Tensor> outs;
    {
      running = n;
      const PendingInputGradients offer(pending_input);
      outs = n->apply(std::move(inputs));
    }
    if (!options.retain_graph) n->release();
    auto& edges = n->next_edges();
    MT_CHECK(outs.empty() || outs.size() == edges.size(), "node ", n->name(), " returned ",
             outs.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.fn || !wanted(e.fn.get())) continue;
      if (i < outs.size() && outs[i].defined())
        add_grad(e.fn.get(), e.input_nr, std::move(outs[i]));
      int& deps = dependencies[e.fn.get()];
      if (--deps == 0) {
        deps = -1;
        ready.push(e.fn.get());
      }
    }
  }
  return results;
}

}  // namespace

Tensor pending_input_gradient(size_t input, const Shape& shape, Device device) {
  return g_pending_input != nullptr ? (*g_pending_input)(input, shape, device) : Tensor();
}

bool may_overwrite_saved(const Tensor& saved) {
  return g_releasing_saved && saved.defined() && saved.storage().use_count() == 1 &&
         !saved.storage()->borrowed();
}

void backward(const Tensor& root, const Tensor& grad, BackwardOptions options) {
  backward(std::vector<Tensor>{root}, std::vector<Tensor>{grad}, options);
}

void backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
              BackwardOptions options) {
  run_backward(roots, grads, options, {});
}

std::vector<Tensor> grad(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads,
                         const std::vector<Tensor>& inputs, BackwardOptions options) {
  std::vector<Edge> capture;
  capture.reserve(inputs.size());
  for (const Tensor& t : inputs) capture.push_back(gradient_edge(t));
  return run_backward(roots, grads, options, capture);
}

void register_grad_ready_hook(Tensor& leaf, GradReadyHook hook) {
  MT_CHECK(leaf.is_leaf() && leaf.requires_grad(),
           "gradient-ready hooks attach to leaf tensors that require grad");
  leaf.autograd_meta().grad_ready_hooks.push_back(std::move(hook));
}

void clear_grad_ready_hooks(Tensor& leaf) {
  if (leaf.has_autograd_meta()) leaf.autograd_meta().grad_ready_hooks.clear();
}

}  // namespace meshtrain::autograd
