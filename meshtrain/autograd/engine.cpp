#include "meshtrain/autograd/engine.h"

#include <functional>
#include <optional>
#include <queue>
#include <unordered_map>

#include "meshtrain/autograd/grad_mode.h"
#include "meshtrain/autograd/node.h"
#include "meshtrain/tensor/ops.h"

namespace meshtrain::autograd {
namespace {

struct PendingInputs {
  std::vector<Tensor> grads;
  // halves[i]: grads[i] rounded to a half type, offered by the node that last summed into it
  // (offer_half_gradient); dropped whenever grads[i] changes.
  std::vector<Tensor> halves;
};

// What a running node's backward may ask of the pass (pending_input_gradient,
// offer_half_gradient, incoming_half_gradient): one set per pass, set around each node's
// backward and restored after (a backward may run a pass of its own); null outside one.
struct RunningNode {
  std::function<Tensor(size_t, const Shape&, Device)> pending_input;
  std::function<void(size_t, const Tensor&, Tensor)> offer_half;
  std::function<Tensor(size_t, DType)> incoming_half;
};
thread_local const RunningNode* g_running = nullptr;

class RunningNodeScope {
 public:
  explicit RunningNodeScope(const RunningNode& r) : prev_(g_running) { g_running = &r; }
  ~RunningNodeScope() { g_running = prev_; }
  RunningNodeScope(const RunningNodeScope&) = delete;
  RunningNodeScope& operator=(const RunningNodeScope&) = delete;

 private:
  const RunningNode* prev_;
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

// The seeds of the backward pass running in this thread whose values the host knows (given on
// the host, or the default 1), each with its value: scalar_gradient_value reads them without a
// wait for the device. The handles keep the seeds alive, so a match is never a reused address.
using KnownSeeds = std::vector<std::pair<Tensor, float>>;
thread_local const KnownSeeds* g_known_seeds = nullptr;

class KnownSeedsScope {
 public:
  explicit KnownSeedsScope(const KnownSeeds& seeds) : prev_(g_known_seeds) {
    g_known_seeds = &seeds;
  }
  ~KnownSeedsScope() { g_known_seeds = prev_; }
  KnownSeedsScope(const KnownSeedsScope&) = delete;
  KnownSeedsScope& operator=(const KnownSeedsScope&) = delete;

 private:
  const KnownSeeds* prev_;
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
    if (slot < p.halves.size()) p.halves[slot] = Tensor();  // the sum changes
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

  KnownSeeds known_seeds;
  const KnownSeedsScope known_scope(known_seeds);
  for (size_t i = 0; i < roots.size(); ++i) {
    Tensor g = grads[i];
    std::optional<float> known;
    if (!g.defined()) {
      MT_CHECK(roots[i].numel() == 1, "backward: a gradient is needed for non-scalar root ",
               roots[i].str());
      g = Tensor::ones(roots[i].shape(), roots[i].dtype(), roots[i].device());
      known = 1.0f;
    } else if (g.device() != roots[i].device()) {
      if (g.numel() == 1 && g.device().is_cpu()) known = g.item();
      g = g.to(roots[i].device());
    }
    if (known) known_seeds.emplace_back(g, *known);
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

  Node* running = nullptr;
  std::vector<Tensor> running_halves;  // the half copies of the running node's incoming gradients
  // Half copies the running node offered of gradients it returns: (gradient, copy) per input.
  std::vector<std::pair<Tensor, Tensor>> returned_halves;
  // The pending entry of the running node's input, where there is one.
  auto pending_of = [&](size_t input) -> PendingInputs* {
    const auto& edges = running->next_edges();
    if (input >= edges.size() || !edges[input].fn || !wanted(edges[input].fn.get())) return nullptr;
    auto it = pending.find(edges[input].fn.get());
    if (it == pending.end() || edges[input].input_nr >= it->second.grads.size()) return nullptr;
    return &it->second;
  };
  RunningNode hooks;
  // The pending gradient of the running node's input, where the pass alone holds it.
  hooks.pending_input = [&](size_t input, const Shape& shape, Device device) -> Tensor {
    PendingInputs* p = pending_of(input);
    if (p == nullptr) return {};
    Tensor& cur = p->grads[running->next_edges()[input].input_nr];
    if (!cur.defined() || cur.dtype() != DType::f32 || cur.shape() != shape ||
        cur.device() != device || !cur.uniquely_held())
      return {};
    return cur;
  };
  hooks.offer_half = [&](size_t input, const Tensor& grad, Tensor half) {
    PendingInputs* p = pending_of(input);
    if (p != nullptr) {
      const uint32_t slot = running->next_edges()[input].input_nr;
      if (p->grads[slot].is_same(grad)) {
        if (p->halves.size() <= slot) p->halves.resize(slot + 1);
        p->halves[slot] = std::move(half);
        return;
      }
    }
    // A gradient the node returns: attached once the pass has put it in place, if it goes there
    // as it is (the first to arrive, of its type).
    if (returned_halves.size() <= input) returned_halves.resize(input + 1);
    returned_halves[input] = {grad, std::move(half)};
  };
  hooks.incoming_half = [&](size_t slot, DType dtype) -> Tensor {
    if (slot >= running_halves.size() || !running_halves[slot].defined() ||
        running_halves[slot].dtype() != dtype)
      return {};
    return running_halves[slot];
  };

  while (!ready.empty()) {
    Node* n = ready.top();
    ready.pop();
    std::vector<Tensor> inputs = std::move(pending[n].grads);
    running_halves = std::move(pending[n].halves);
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
    returned_halves.clear();
    {
      running = n;
      const RunningNodeScope scope(hooks);
      outs = n->apply(std::move(inputs));
    }
    running_halves.clear();
    if (!options.retain_graph) n->release();
    auto& edges = n->next_edges();
    MT_CHECK(outs.empty() || outs.size() == edges.size(), "node ", n->name(), " returned ",
             outs.size(), " gradients for ", edges.size(), " inputs");
    for (size_t i = 0; i < edges.size(); ++i) {
      const Edge& e = edges[i];
      if (!e.fn || !wanted(e.fn.get())) continue;
      if (i < outs.size() && outs[i].defined()) {
        Tensor given = i < returned_halves.size() ? std::move(returned_halves[i].second) : Tensor();
        const Tensor out =
            given.defined() && returned_halves[i].first.is_same(outs[i]) ? outs[i] : Tensor();
        add_grad(e.fn.get(), e.input_nr, std::move(outs[i]));
        PendingInputs& p = pending[e.fn.get()];
        if (out.defined() && p.grads[e.input_nr].is_same(out)) {
          if (p.halves.size() <= e.input_nr) p.halves.resize(e.input_nr + 1);
          p.halves[e.input_nr] = std::move(given);
        }
      }
      int& deps = dependencies[e.fn.get()];
      if (--deps == 0) {
        deps = -1;
        ready.push(e.fn.get());
      }
    }
    // Its handles would keep the gradients from being summed into in place.
    returned_halves.clear();
  }
  return results;
}

}  // namespace

Tensor pending_input_gradient(size_t input, const Shape& shape, Device device) {
  return g_running != nullptr ? g_running->pending_input(input, shape, device) : Tensor();
}

void offer_half_gradient(size_t input, const Tensor& grad, Tensor half) {
  MT_CHECK(g_running != nullptr, "offer_half_gradient outside a node's backward");
  MT_CHECK(half.defined() && half.shape() == grad.shape() && is_floating(half.dtype()) &&
               dtype_size(half.dtype()) == 2,
           "offer_half_gradient: a half copy of ", grad.str(), " is needed, got ",
           half.defined() ? half.str() : std::string("none"));
  g_running->offer_half(input, grad, std::move(half));
}

Tensor incoming_half_gradient(size_t slot, DType dtype) {
  return g_running != nullptr ? g_running->incoming_half(slot, dtype) : Tensor();
}

float scalar_gradient_value(const Tensor& grad) {
  MT_CHECK(grad.defined() && grad.numel() == 1,
           "scalar_gradient_value: a scalar gradient is needed, got ",
           grad.defined() ? grad.str() : std::string("none"));
  if (g_known_seeds != nullptr)
    for (const auto& [seed, value] : *g_known_seeds)
      if (seed.is_same(grad)) return value;
  return grad.item();
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
