#include "meshtrain/autograd/moe_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>

#include <omp.h>

#include "meshtrain/autograd/function.h"
#include "meshtrain/autograd/op_checks.h"
#include "meshtrain/tensor/cpu/gelu.h"
#include "meshtrain/tensor/cpu/gemm.h"
#include "meshtrain/tensor/cpu/gemm_onednn.h"
#include "meshtrain/tensor/cpu/index_rows.h"
#include "meshtrain/tensor/cpu/kernel_clock.h"
#include "meshtrain/tensor/cpu/reduce.h"

namespace meshtrain::autograd {
namespace {

using detail::check_cpu_only;
using detail::check_f32;
using detail::kernels_for;

void check_rows(const Tensor& t, int64_t rows, const char* op, const char* what) {
  check_f32(t, op, what);
  MT_CHECK(t.dim() == 2 && t.size(0) == rows, op, ": ", what, " must have ", rows, " rows, got ",
           shape_str(t.shape()));
}

// The routing's token of each kept assignment where the rows are: the routing's own array on the
// CPU, a copy on a device (the kernels read it there).
class TokenIndex {
 public:
  TokenIndex(const nn::MoERouting& r, Device device) {
    if (!device.is_cpu())
      on_device_ = Tensor::from_vector(r.token, {static_cast<int64_t>(r.token.size())}).to(device);
    host_ = r.token.data();
  }
  // Expert e's tokens, from its first assignment `begin`.
  const int32_t* from(int64_t begin) const {
    return (on_device_.defined() ? on_device_.data<int32_t>() : host_) + begin;
  }

 private:
  Tensor on_device_;
  const int32_t* host_ = nullptr;
};

// The experts' rows of the tokens: expert e gets x[token[m], :] for its assignments m.
class Dispatch final : public Function {
 public:
  explicit Dispatch(RoutingPtr r) : r_(std::move(r)) {}
  std::string name() const override { return "moe_dispatch"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    const Tensor& x = in[0];
    check_rows(x, r_->tokens, "moe_dispatch", "input");
    C_ = x.size(1);
    k_ = kernels_for("moe_dispatch", {&x});
    dev_ = x.device();
    tokens_.emplace(*r_, dev_);
    std::vector<Tensor> out;
    for (int64_t e = 0; e < r_->experts; ++e) {
      const int64_t begin = r_->offsets[static_cast<size_t>(e)], n = r_->load(e);
      Tensor rows = Tensor::empty({n, C_}, DType::f32, dev_);
      if (k_ != nullptr)
        k_->gather_rows(dev_, rows.data<float>(), x.data<float>(), tokens_->from(begin), n, C_);
      else
        cpu::gather_rows(rows.data<float>(), x.data<float>(), tokens_->from(begin), n, C_);
      out.push_back(std::move(rows));
    }
    return out;
  }

  // Each token's gradient is the sum of its rows' in expert order, from zero.
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    Tensor dx = Tensor::zeros({r_->tokens, C_}, DType::f32, dev_);
    for (int64_t e = 0; e < r_->experts; ++e) {
      const Tensor& g = grads[static_cast<size_t>(e)];
      if (!g.defined() || r_->load(e) == 0) continue;
      const int32_t* rows = tokens_->from(r_->offsets[static_cast<size_t>(e)]);
      if (k_ != nullptr)
        k_->scatter_add_rows(dev_, dx.data<float>(), g.data<float>(), rows, nullptr, r_->load(e),
                             C_);
      else
        cpu::scatter_add_rows(dx.data<float>(), g.data<float>(), rows, nullptr, r_->load(e), C_);
    }
    return {dx};
  }

 private:
  RoutingPtr r_;
  int64_t C_ = 0;
  DeviceKernels* k_ = nullptr;
  Device dev_;
  std::optional<TokenIndex> tokens_;
};

// Per kept assignment m: the probability of its expert, and the sum over its token's kept
// choices (top-2) that divides it.
class Gates final : public Function {
 public:
  explicit Gates(RoutingPtr r) : r_(std::move(r)) {}
  std::string name() const override { return "moe_gates"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    const Tensor& probs = in[0];
    check_rows(probs, r_->tokens, "moe_gates", "probabilities");
    check_cpu_only(probs, "moe_gates");
    MT_CHECK(probs.size(1) == r_->experts, "moe_gates: probabilities have ", probs.size(1),
             " experts, the routing ", r_->experts);
    probs_ = probs.detach();
    const float* p = probs.data<float>();
    const int64_t M = r_->kept(), E = r_->experts;
    denom_.assign(static_cast<size_t>(r_->tokens), 0.0f);
    if (r_->top_k > 1)
      for (int64_t m = 0; m < M; ++m) {
        const int32_t t = r_->token[static_cast<size_t>(m)];
        denom_[static_cast<size_t>(t)] += p[t * E + r_->expert[static_cast<size_t>(m)]];
      }
    Tensor gates = Tensor::empty({M});
    float* g = gates.data<float>();
    for (int64_t m = 0; m < M; ++m) {
      const int32_t t = r_->token[static_cast<size_t>(m)];
      const float pe = p[t * E + r_->expert[static_cast<size_t>(m)]];
      g[m] = r_->top_k > 1 ? pe / denom_[static_cast<size_t>(t)] : pe;
    }
    return {gates};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const int64_t M = r_->kept(), E = r_->experts;
    Tensor dp = Tensor::zeros({r_->tokens, E});
    if (!grads[0].defined()) return {dp};
    const float* g = grads[0].data<float>();
    const float* p = probs_.data<float>();
    float* d = dp.data<float>();
    if (r_->top_k == 1) {
      for (int64_t m = 0; m < M; ++m)
        d[r_->token[static_cast<size_t>(m)] * E + r_->expert[static_cast<size_t>(m)]] += g[m];
      return {dp};
    }
    // w_i = p_i / S: dL/dp_j = g_j / S - (sum_i g_i p_i) / S^2 over the token's kept choices.
    std::vector<float> weighted(static_cast<size_t>(r_->tokens), 0.0f);
    for (int64_t m = 0; m < M; ++m) {
      const int32_t t = r_->token[static_cast<size_t>(m)];
      weighted[static_cast<size_t>(t)] += g[m] * p[t * E + r_->expert[static_cast<size_t>(m)]];
    }
    for (int64_t m = 0; m < M; ++m) {
      const int32_t t = r_->token[static_cast<size_t>(m)];
      const float S = denom_[static_cast<size_t>(t)];
      d[t * E + r_->expert[static_cast<size_t>(m)]] +=
          g[m] / S - weighted[static_cast<size_t>(t)] / (S * S);
    }
    return {dp};
  }

 private:
  RoutingPtr r_;
  Tensor probs_;
  std::vector<float> denom_;
};

// Inputs: the experts' outputs, then the gates. Each token's output is the gated sum of its
// experts' rows, added from zero in expert order.
class Combine final : public Function {
 public:
  explicit Combine(RoutingPtr r) : r_(std::move(r)) {}
  std::string name() const override { return "moe_combine"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    const auto E = static_cast<size_t>(r_->experts);
    MT_CHECK(in.size() == E + 1, "moe_combine: ", in.size() - 1, " expert outputs for ", E,
             " experts");
    C_ = -1;
    for (size_t e = 0; e < E; ++e) {
      check_rows(in[e], r_->load(static_cast<int64_t>(e)), "moe_combine", "an expert's output");
      if (C_ < 0 || r_->load(static_cast<int64_t>(e)) > 0) C_ = in[e].size(1);
    }
    const Tensor& gates = in[E];
    check_f32(gates, "moe_combine", "gates");
    MT_CHECK(gates.numel() == r_->kept(), "moe_combine: ", gates.numel(), " gates for ", r_->kept(),
             " assignments");
    k_ = kernels_for("moe_combine", {&gates, &in[0]});
    dev_ = gates.device();
    for (size_t e = 1; e < E; ++e) (void)kernels_for("moe_combine", {&gates, &in[e]});
    tokens_.emplace(*r_, dev_);
    outs_.clear();
    for (size_t e = 0; e < E; ++e) outs_.push_back(in[e].detach());
    gates_ = gates.detach();
    Tensor out = Tensor::zeros({r_->tokens, C_}, DType::f32, dev_);
    for (size_t e = 0; e < E; ++e) {
      const int64_t n = r_->load(static_cast<int64_t>(e)), begin = r_->offsets[e];
      if (n == 0) continue;
      const float* w = gates.data<float>() + begin;
      if (k_ != nullptr)
        k_->scatter_add_rows(dev_, out.data<float>(), in[e].data<float>(), tokens_->from(begin), w,
                             n, C_);
      else
        cpu::scatter_add_rows(out.data<float>(), in[e].data<float>(), tokens_->from(begin), w, n,
                              C_);
    }
    return {out};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const auto E = static_cast<size_t>(r_->experts);
    std::vector<Tensor> out;
    Tensor dgates = Tensor::zeros({r_->kept()}, DType::f32, dev_);
    if (!grads[0].defined()) {
      for (size_t e = 0; e < E; ++e)
        out.push_back(Tensor::zeros(outs_[e].shape(), DType::f32, dev_));
      out.push_back(dgates);
      return out;
    }
    for (size_t e = 0; e < E; ++e) {
      const int64_t n = r_->load(static_cast<int64_t>(e)), begin = r_->offsets[e];
      Tensor dy = Tensor::empty({n, C_}, DType::f32, dev_);
      if (n > 0) {
        float* dg = dgates.data<float>() + begin;
        const float* g = gates_.data<float>() + begin;
        if (k_ != nullptr)
          k_->weighted_rows_backward(dev_, dy.data<float>(), dg, grads[0].data<float>(),
                                     outs_[e].data<float>(), g, tokens_->from(begin), n, C_);
        else
          cpu::weighted_rows_backward(dy.data<float>(), dg, grads[0].data<float>(),
                                      outs_[e].data<float>(), g, tokens_->from(begin), n, C_);
      }
      out.push_back(std::move(dy));
    }
    out.push_back(dgates);
    return out;
  }

 private:
  RoutingPtr r_;
  int64_t C_ = 0;
  DeviceKernels* k_ = nullptr;
  Device dev_;
  std::optional<TokenIndex> tokens_;
  std::vector<Tensor> outs_;
  Tensor gates_;
};

class LoadBalancing final : public Function {
 public:
  explicit LoadBalancing(RoutingPtr r) : r_(std::move(r)) {}
  std::string name() const override { return "load_balancing_loss"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    const Tensor& probs = in[0];
    check_rows(probs, r_->tokens, "load_balancing_loss", "probabilities");
    check_cpu_only(probs, "load_balancing_loss");
    const int64_t N = r_->tokens, E = r_->experts;
    const float* p = probs.data<float>();
    // coef[e] = E * f_e / N: the loss is sum over n, e of coef[e] * p[n, e].
    coef_.assign(static_cast<size_t>(E), 0.0);
    const double choices = static_cast<double>(std::max<int64_t>(1, N * r_->top_k));
    for (int64_t e = 0; e < E; ++e)
      coef_[static_cast<size_t>(e)] =
          static_cast<double>(E) *
          (static_cast<double>(r_->chosen[static_cast<size_t>(e)]) / choices) /
          static_cast<double>(std::max<int64_t>(1, N));
    double loss = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e) loss += coef_[static_cast<size_t>(e)] * p[n * E + e];
    return {Tensor::scalar(static_cast<float>(loss))};
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const int64_t N = r_->tokens, E = r_->experts;
    Tensor dp = Tensor::empty({N, E});
    const float g = grads[0].defined() ? grads[0].item() : 0.0f;
    float* d = dp.data<float>();
    for (int64_t n = 0; n < N; ++n)
      for (int64_t e = 0; e < E; ++e)
        d[n * E + e] = static_cast<float>(g * coef_[static_cast<size_t>(e)]);
    return {dp};
  }

 private:
  RoutingPtr r_;
  std::vector<double> coef_;
};

class ZLoss final : public Function {
 public:
  std::string name() const override { return "router_z_loss"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    const Tensor& logits = in[0];
    check_f32(logits, "router_z_loss", "logits");
    check_cpu_only(logits, "router_z_loss");
    MT_CHECK(logits.dim() == 2, "router_z_loss: logits must be [N, E], got ",
             shape_str(logits.shape()));
    logits_ = logits.detach();
    const int64_t N = logits.size(0), E = logits.size(1);
    const float* x = logits.data<float>();
    lse_.assign(static_cast<size_t>(N), 0.0);
    double loss = 0;
    for (int64_t n = 0; n < N; ++n) {
      double mx = x[n * E];
      for (int64_t e = 1; e < E; ++e) mx = std::max<double>(mx, x[n * E + e]);
      double s = 0;
      for (int64_t e = 0; e < E; ++e) s += std::exp(x[n * E + e] - mx);
      lse_[static_cast<size_t>(n)] = mx + std::log(s);
      loss += lse_[static_cast<size_t>(n)] * lse_[static_cast<size_t>(n)];
    }
    return {
        Tensor::scalar(static_cast<float>(loss / static_cast<double>(std::max<int64_t>(1, N))))};
  }

  // d/dx[n, e] = 2 lse_n softmax(x_n)_e / N.
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    const int64_t N = logits_.size(0), E = logits_.size(1);
    Tensor dx = Tensor::empty({N, E});
    const double g = grads[0].defined() ? grads[0].item() : 0.0;
    const float* x = logits_.data<float>();
    float* d = dx.data<float>();
    for (int64_t n = 0; n < N; ++n) {
      const double lse = lse_[static_cast<size_t>(n)];
      for (int64_t e = 0; e < E; ++e)
        d[n * E + e] = static_cast<float>(g * 2.0 * lse * std::exp(x[n * E + e] - lse) /
                                          static_cast<double>(N));
    }
    return {dx};
  }

 private:
  Tensor logits_;
  std::vector<double> lse_;
};

class AttachLoss final : public Function {
 public:
  explicit AttachLoss(float grad) : grad_(grad) {}
  std::string name() const override { return "attach_loss"; }
  // A view of its own: the output carries this node's history, the input keeps its own.
  std::vector<Tensor> forward(const std::vector<Tensor>& in) override { return {in[0].detach()}; }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return {grads[0], Tensor::scalar(grad_)};
  }

 private:
  float grad_;
};

// The two directions of one route: forward one way, backward the other. Every rank of the route
// runs both in the same order (the same layers in the same order), so the collectives match.
class ExpertExchangeFn final : public Function {
 public:
  ExpertExchangeFn(std::shared_ptr<const nn::ExpertRoute> route, bool to_experts)
      : route_(std::move(route)), to_experts_(to_experts) {}
  std::string name() const override { return to_experts_ ? "moe_to_experts" : "moe_to_tokens"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    return to_experts_ ? route_->to_experts(in) : route_->to_tokens(in);
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    return to_experts_ ? route_->to_tokens(grads) : route_->to_experts(grads);
  }

 private:
  std::shared_ptr<const nn::ExpertRoute> route_;
  bool to_experts_;
};

// Multiply-adds of one expert's c_fc product below which the experts run side by side.
constexpr int64_t kSmallExpertMacs = int64_t{1} << 22;

// Inputs: the G experts' rows, then per expert c_fc.weight, c_proj.weight and (with biases)
// c_fc.bias, c_proj.bias. Outputs: the G experts' outputs.

class GroupedExpertMlps final : public Function {
 public:
  GroupedExpertMlps(size_t experts, bool bias) : G_(experts), bias_(bias) {}
  std::string name() const override { return "grouped_expert_mlps"; }

  std::vector<Tensor> forward(const std::vector<Tensor>& in) override {
    MT_CHECK(in.size() == G_ * (bias_ ? 5 : 3), "grouped_expert_mlps: ", in.size(), " inputs");
    x_.assign(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(G_));
    h_.resize(G_);
    a_.resize(G_);
    w_.clear();
    std::vector<Tensor> out(G_);
    for (size_t g = 0; g < G_; ++g) {
      Weights w{in[G_ + 2 * g], in[G_ + 2 * g + 1], bias_ ? in[3 * G_ + 2 * g] : Tensor(),
                bias_ ? in[3 * G_ + 2 * g + 1] : Tensor()};
      check_rows(x_[g], x_[g].size(0), "grouped_expert_mlps", "rows");
      MT_CHECK(w.fc.dim() == 2 && w.proj.dim() == 2 && w.fc.size(1) == x_[g].size(1) &&
                   w.proj.size(1) == w.fc.size(0) && w.proj.size(0) == x_[g].size(1),
               "grouped_expert_mlps: expert ", g, " weights ", shape_str(w.fc.shape()), " and ",
               shape_str(w.proj.shape()), " do not fit rows ", shape_str(x_[g].shape()));
      const int64_t M = x_[g].size(0), C = x_[g].size(1), H = w.fc.size(0);
      h_[g] = Tensor::empty({M, H});
      a_[g] = Tensor::empty({M, H});
      out[g] = Tensor::empty({M, C});
      w_.push_back(std::move(w));
    }
    run_each([&](size_t g) {
      const cpu::gemm_onednn::RowsVary rows_vary;
      const Weights& w = w_[g];
      const int64_t M = x_[g].size(0), C = x_[g].size(1), H = w.fc.size(0);
      cpu::linear_forward(h_[g].data<float>(), x_[g].data<float>(), w.fc.data<float>(),
                          bias_ ? w.fc_b.data<float>() : nullptr, M, C, H);
      cpu::gelu_forward(a_[g].data<float>(), h_[g].data<float>(), M * H);
      cpu::linear_forward(out[g].data<float>(), a_[g].data<float>(), w.proj.data<float>(),
                          bias_ ? w.proj_b.data<float>() : nullptr, M, H, C);
    });
    return out;
  }

  std::vector<Tensor> backward(const std::vector<Tensor>& grads) override {
    std::vector<Tensor> dx(G_), dfc(G_), dproj(G_), dfc_b(G_), dproj_b(G_);
    for (size_t g = 0; g < G_; ++g) {
      const int64_t M = x_[g].size(0), C = x_[g].size(1), H = w_[g].fc.size(0);
      dx[g] = Tensor::empty({M, C});
      dfc[g] = Tensor::empty({H, C});
      dproj[g] = Tensor::empty({C, H});
      if (bias_) {
        dfc_b[g] = Tensor::empty({H});
        dproj_b[g] = Tensor::empty({C});
      }
    }
    run_each([&](size_t g) {
      const cpu::gemm_onednn::RowsVary rows_vary;
      const Weights& w = w_[g];
      const int64_t M = x_[g].size(0), C = x_[g].size(1), H = w.fc.size(0);
      // An output nobody used has no gradient: as zeros (the weights still get theirs).
      Tensor zero = grads[g].defined() ? Tensor() : Tensor::zeros({M, C});
      const float* dy = grads[g].defined() ? grads[g].data<float>() : zero.data<float>();
      // linear's backward for c_proj, gelu's, linear's for c_fc: MLP::forward's graph.
      Tensor da = Tensor::empty({M, H}), dh = Tensor::empty({M, H});
      cpu::matmul(da.data<float>(), dy, w.proj.data<float>(), M, H, C, false, false, 1.0f, 0.0f);
      cpu::matmul(dproj[g].data<float>(), dy, a_[g].data<float>(), C, H, M, true, false, 1.0f,
                  0.0f);
      if (bias_) cpu::sum_first_dim(dproj_b[g].data<float>(), dy, M, C, false);
      cpu::gelu_backward(dh.data<float>(), h_[g].data<float>(), da.data<float>(), M * H);
      cpu::matmul(dx[g].data<float>(), dh.data<float>(), w.fc.data<float>(), M, C, H, false, false,
                  1.0f, 0.0f);
      cpu::matmul(dfc[g].data<float>(), dh.data<float>(), x_[g].data<float>(), H, C, M, true, false,
                  1.0f, 0.0f);
      if (bias_) cpu::sum_first_dim(dfc_b[g].data<float>(), dh.data<float>(), M, H, false);
    });
    std::vector<Tensor> out = dx;
    for (size_t g = 0; g < G_; ++g) {
      out.push_back(dfc[g]);
      out.push_back(dproj[g]);
    }
    if (bias_)
      for (size_t g = 0; g < G_; ++g) {
        out.push_back(dfc_b[g]);
        out.push_back(dproj_b[g]);
      }
    x_.clear();
    h_.clear();
    a_.clear();
    w_.clear();
    return out;
  }

 private:
  struct Weights {
    Tensor fc, proj, fc_b, proj_b;
  };

  // Each expert's work once: side by side, one expert per thread (whose kernels then run on it
  // alone), when the rank has threads to spare, more than one expert has rows and every
  // expert's products are small (below cpu::matmul_batched's bound, where one product split over
  // the threads leaves them waiting on each other); otherwise in order, each kernel using every
  // thread.
  template <typename F>
  void run_each(F&& f) const {
    int busy = 0;
    int64_t largest = 0;
    for (size_t g = 0; g < G_; ++g) {
      busy += x_[g].size(0) > 0 ? 1 : 0;
      largest = std::max(largest, x_[g].size(0) * x_[g].size(1) * w_[g].fc.size(0));
    }
    if (busy > 1 && largest < kSmallExpertMacs && omp_get_max_threads() > 1) {
      cpu::KernelTimer timer(cpu::KernelKind::gemm);
#pragma omp parallel for schedule(dynamic, 1)
      for (size_t g = 0; g < G_; ++g) f(g);
    } else {
      for (size_t g = 0; g < G_; ++g) f(g);
    }
  }

  size_t G_;
  bool bias_;
  std::vector<Tensor> x_, h_, a_;
  std::vector<Weights> w_;
};

}  // namespace

std::vector<Tensor> grouped_expert_mlps(const std::vector<Tensor>& rows,
                                        const std::vector<ExpertMlp>& experts) {
  MT_CHECK(rows.size() == experts.size(), "grouped_expert_mlps: ", rows.size(), " row sets for ",
           experts.size(), " experts");
  const bool bias = !experts.empty() && experts.front().fc_bias.defined();
  std::vector<Tensor> in = rows;
  for (const ExpertMlp& e : experts) {
    in.push_back(e.fc_weight);
    in.push_back(e.proj_weight);
  }
  if (bias)
    for (const ExpertMlp& e : experts) {
      MT_CHECK(e.fc_bias.defined() && e.proj_bias.defined(),
               "grouped_expert_mlps: every expert has biases or none does");
      in.push_back(e.fc_bias);
      in.push_back(e.proj_bias);
    }
  return Function::apply(std::make_shared<GroupedExpertMlps>(rows.size(), bias), in);
}

std::vector<Tensor> moe_to_experts(const std::vector<Tensor>& by_expert,
                                   const std::shared_ptr<const nn::ExpertRoute>& route) {
  return Function::apply(std::make_shared<ExpertExchangeFn>(route, true), by_expert);
}

std::vector<Tensor> moe_to_tokens(const std::vector<Tensor>& local,
                                  const std::shared_ptr<const nn::ExpertRoute>& route) {
  return Function::apply(std::make_shared<ExpertExchangeFn>(route, false), local);
}

std::vector<Tensor> moe_dispatch(const Tensor& x, const RoutingPtr& routing) {
  return Function::apply(std::make_shared<Dispatch>(routing), {x});
}

Tensor moe_gates(const Tensor& probs, const RoutingPtr& routing) {
  return Function::apply(std::make_shared<Gates>(routing), {probs})[0];
}

Tensor moe_combine(const std::vector<Tensor>& expert_out, const Tensor& gates,
                   const RoutingPtr& routing) {
  std::vector<Tensor> in = expert_out;
  in.push_back(gates);
  return Function::apply(std::make_shared<Combine>(routing), in)[0];
}

Tensor load_balancing_loss(const Tensor& probs, const RoutingPtr& routing) {
  return Function::apply(std::make_shared<LoadBalancing>(routing), {probs})[0];
}

Tensor router_z_loss(const Tensor& logits) {
  return Function::apply(std::make_shared<ZLoss>(), {logits})[0];
}

Tensor attach_loss(const Tensor& x, const Tensor& loss, float grad) {
  return Function::apply(std::make_shared<AttachLoss>(grad), {x, loss})[0];
}

}  // namespace meshtrain::autograd
