// Convolutions through oneDNN. Creating a oneDNN primitive means choosing a kernel and
// JIT-compiling it, so each (shape, bias, direction, ReLU post-op) gets its primitive once per
// thread and keeps it, together with the buffers in the layouts that primitive prefers (blocked
// channels, nChw8c or nChw16c) and the reorders between those and our plain NCHW arrays; a training
// step then only runs them. The cache is per thread so that ranks run as threads (tests) never
// share a scratch buffer; the engine is shared, each thread has its own stream. Padding is
// symmetric, so padding_r = padding_l and oneDNN's output size, floor((H + 2p - dil*(K-1) - 1) /
// stride) + 1, is PyTorch's.
#include <oneapi/dnnl/dnnl.hpp>

#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "meshtrain/tensor/cpu/conv2d_impl.h"
#include "meshtrain/tensor/cpu/onednn_context.h"
#include "meshtrain/util/error.h"

namespace meshtrain::cpu::conv2d_onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// One argument of a primitive: a plain view of the caller's array and, when the primitive wants
// another layout, a buffer of that layout and the reorder between the two.
class Port {
 public:
  Port(const memory::desc& plain, const memory::desc& wanted, bool input)
      : plain_(plain, onednn_engine(), DNNL_MEMORY_NONE) {
    if (wanted == plain) {
      inner_ = plain_;
      return;
    }
    inner_ = memory(wanted, onednn_engine());
    reorder_ = input ? dnnl::reorder(plain_, inner_) : dnnl::reorder(inner_, plain_);
  }

  // An input: the primitive's view of p, converted to its layout when it wants another.
  const memory& in(const float* p) {
    plain_.set_data_handle(const_cast<float*>(p));
    if (reorder_) reorder_->execute(onednn_stream(), plain_, inner_);
    return inner_;
  }
  // An output: where the primitive writes; call finish() after it ran to land the result in p.
  const memory& out(float* p) {
    plain_.set_data_handle(p);
    return inner_;
  }
  void finish() {
    if (reorder_) reorder_->execute(onednn_stream(), inner_, plain_);
  }

 private:
  memory plain_;
  memory inner_;
  std::optional<dnnl::reorder> reorder_;
};

struct Geometry {
  memory::dims src, wei, bias, dst, strides, dilates, pad;
  Tag wei_tag;
};

Geometry geometry(const Conv2dShape& s) {
  Geometry g;
  g.src = {s.N, s.C_in, s.H, s.W};
  g.dst = {s.N, s.C_out, s.out_h(), s.out_w()};
  g.bias = {s.C_out};
  // Grouped weights are [G, C_out/G, C_in/G, KH, KW] to oneDNN: the same bytes as PyTorch's
  // [C_out, C_in/G, KH, KW].
  if (s.groups == 1) {
    g.wei = {s.C_out, s.C_in, s.KH, s.KW};
    g.wei_tag = Tag::oihw;
  } else {
    g.wei = {s.groups, s.C_out / s.groups, s.C_in / s.groups, s.KH, s.KW};
    g.wei_tag = Tag::goihw;
  }
  g.strides = {s.stride_h, s.stride_w};
  g.dilates = {s.dil_h - 1, s.dil_w - 1};  // oneDNN counts the gaps: 0 is no dilation
  g.pad = {s.pad_h, s.pad_w};
  return g;
}

memory::desc any(const memory::dims& d) {
  return memory::desc(d, Dt::f32, Tag::any);
}
memory::desc plain(const memory::dims& d, Tag tag) {
  return memory::desc(d, Dt::f32, tag);
}

// The forward descriptor, also the hint every backward primitive is created with. relu appends
// max(x, 0) as an eltwise post-op, applied to each output block as it is produced. Inference keeps
// forward_training too: with forward_inference oneDNN 2.6 picks its brgconv kernels on NHWC
// arrays, and the reorders between those and our NCHW arrays made the small ResNet's evaluation
// 15% slower than the unfused layers on the blocked (nChw16c) kernels, not faster.
dnnl::convolution_forward::primitive_desc forward_pd(const Geometry& g, bool bias,
                                                     bool relu = false) {
  using F = dnnl::convolution_forward;
  const auto prop = dnnl::prop_kind::forward_training;
  const auto alg = dnnl::algorithm::convolution_direct;
  const F::desc d = bias ? F::desc(prop, alg, any(g.src), any(g.wei), plain(g.bias, Tag::x),
                                   any(g.dst), g.strides, g.dilates, g.pad, g.pad)
                         : F::desc(prop, alg, any(g.src), any(g.wei), any(g.dst), g.strides,
                                   g.dilates, g.pad, g.pad);
  dnnl::primitive_attr attr;
  if (relu) {
    dnnl::post_ops ops;
    ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_relu, 0.0f, 0.0f);
    attr.set_post_ops(ops);
  }
  return F::primitive_desc(d, attr, onednn_engine());
}

struct Forward {
  dnnl::convolution_forward prim;
  Port src, wei, dst;
  std::optional<Port> bias;

  Forward(const Geometry& g, bool with_bias, const dnnl::convolution_forward::primitive_desc& pd)
      : prim(pd),
        src(plain(g.src, Tag::nchw), pd.src_desc(), true),
        wei(plain(g.wei, g.wei_tag), pd.weights_desc(), true),
        dst(plain(g.dst, Tag::nchw), pd.dst_desc(), false) {
    if (with_bias) bias.emplace(plain(g.bias, Tag::x), pd.bias_desc(), true);
  }
};

struct BackwardData {
  dnnl::convolution_backward_data prim;
  Port ddst, wei, dsrc;

  BackwardData(const Geometry& g, const dnnl::convolution_backward_data::primitive_desc& pd)
      : prim(pd),
        ddst(plain(g.dst, Tag::nchw), pd.diff_dst_desc(), true),
        wei(plain(g.wei, g.wei_tag), pd.weights_desc(), true),
        dsrc(plain(g.src, Tag::nchw), pd.diff_src_desc(), false) {}
};

struct BackwardWeights {
  dnnl::convolution_backward_weights prim;
  Port src, ddst, dwei;
  std::optional<Port> dbias;

  BackwardWeights(const Geometry& g, bool with_bias,
                  const dnnl::convolution_backward_weights::primitive_desc& pd)
      : prim(pd),
        src(plain(g.src, Tag::nchw), pd.src_desc(), true),
        ddst(plain(g.dst, Tag::nchw), pd.diff_dst_desc(), true),
        dwei(plain(g.wei, g.wei_tag), pd.diff_weights_desc(), false) {
    if (with_bias) dbias.emplace(plain(g.bias, Tag::x), pd.diff_bias_desc(), false);
  }
};

struct Key {
  Conv2dShape shape;
  bool bias;
  bool relu = false;  // inference entries only
  auto operator<=>(const Key&) const = default;
};

struct Cache {
  std::map<Key, std::unique_ptr<Forward>> forward;
  std::map<Key, std::unique_ptr<Forward>> inference;
  std::map<Key, std::unique_ptr<BackwardData>> backward_data;
  std::map<Key, std::unique_ptr<BackwardWeights>> backward_weights;
  int64_t created = 0;

  size_t size() const {
    return forward.size() + inference.size() + backward_data.size() + backward_weights.size();
  }
  void make_room() {
    if (size() < kOnednnMaxCached) return;
    forward.clear();
    inference.clear();
    backward_data.clear();
    backward_weights.clear();
  }
};

Cache& cache() {
  thread_local Cache c;
  return c;
}

Forward& forward_entry(const Conv2dShape& s, bool bias) {
  Cache& c = cache();
  const Key key{s, bias};
  if (auto it = c.forward.find(key); it != c.forward.end()) return *it->second;
  c.make_room();
  const Geometry g = geometry(s);
  auto e = std::make_unique<Forward>(g, bias, forward_pd(g, bias));
  ++c.created;
  return *c.forward.emplace(key, std::move(e)).first->second;
}

Forward& inference_entry(const Conv2dShape& s, bool bias, bool relu) {
  Cache& c = cache();
  const Key key{s, bias, relu};
  if (auto it = c.inference.find(key); it != c.inference.end()) return *it->second;
  c.make_room();
  const Geometry g = geometry(s);
  auto e = std::make_unique<Forward>(g, bias, forward_pd(g, bias, relu));
  ++c.created;
  return *c.inference.emplace(key, std::move(e)).first->second;
}

BackwardData& backward_data_entry(const Conv2dShape& s) {
  Cache& c = cache();
  const Key key{s, false};
  if (auto it = c.backward_data.find(key); it != c.backward_data.end()) return *it->second;
  c.make_room();
  const Geometry g = geometry(s);
  using B = dnnl::convolution_backward_data;
  const B::desc d(dnnl::algorithm::convolution_direct, any(g.src), any(g.wei), any(g.dst),
                  g.strides, g.dilates, g.pad, g.pad);
  auto e = std::make_unique<BackwardData>(
      g, B::primitive_desc(d, onednn_engine(), forward_pd(g, false)));
  ++c.created;
  return *c.backward_data.emplace(key, std::move(e)).first->second;
}

BackwardWeights& backward_weights_entry(const Conv2dShape& s, bool bias) {
  Cache& c = cache();
  const Key key{s, bias};
  if (auto it = c.backward_weights.find(key); it != c.backward_weights.end()) return *it->second;
  c.make_room();
  const Geometry g = geometry(s);
  using B = dnnl::convolution_backward_weights;
  const auto alg = dnnl::algorithm::convolution_direct;
  const B::desc d =
      bias ? B::desc(alg, any(g.src), any(g.wei), plain(g.bias, Tag::x), any(g.dst), g.strides,
                     g.dilates, g.pad, g.pad)
           : B::desc(alg, any(g.src), any(g.wei), any(g.dst), g.strides, g.dilates, g.pad, g.pad);
  auto e = std::make_unique<BackwardWeights>(
      g, bias, B::primitive_desc(d, onednn_engine(), forward_pd(g, bias)));
  ++c.created;
  return *c.backward_weights.emplace(key, std::move(e)).first->second;
}

// oneDNN reports failures as dnnl::error; callers of the kernels expect meshtrain errors.
template <typename F>
void guarded(const char* what, const Conv2dShape& s, F&& f) {
  try {
    f();
  } catch (const dnnl::error& e) {
    MT_THROW(Error, "oneDNN convolution ", what, " failed for ", s.str(), ": ", e.what());
  }
}

void run_forward(Forward& e, float* out, const float* inp, const float* weight, const float* bias) {
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, e.src.in(inp)},
                                       {DNNL_ARG_WEIGHTS, e.wei.in(weight)},
                                       {DNNL_ARG_DST, e.dst.out(out)}};
  if (bias != nullptr) args.emplace(DNNL_ARG_BIAS, e.bias->in(bias));
  e.prim.execute(onednn_stream(), args);
  e.dst.finish();
  onednn_stream().wait();
}

}  // namespace

void forward(float* out, const float* inp, const float* weight, const float* bias,
             const Conv2dShape& s) {
  guarded("forward", s,
          [&] { run_forward(forward_entry(s, bias != nullptr), out, inp, weight, bias); });
}

void forward_inference(float* out, const float* inp, const float* weight, const float* bias,
                       const Conv2dShape& s, bool relu) {
  guarded("inference forward", s,
          [&] { run_forward(inference_entry(s, bias != nullptr, relu), out, inp, weight, bias); });
}

void backward_data(float* dinp, const float* dout, const float* weight, const Conv2dShape& s) {
  guarded("backward (data)", s, [&] {
    BackwardData& e = backward_data_entry(s);
    e.prim.execute(onednn_stream(), {{DNNL_ARG_DIFF_DST, e.ddst.in(dout)},
                                     {DNNL_ARG_WEIGHTS, e.wei.in(weight)},
                                     {DNNL_ARG_DIFF_SRC, e.dsrc.out(dinp)}});
    e.dsrc.finish();
    onednn_stream().wait();
  });
}

void backward_weights(float* dweight, float* dbias, const float* dout, const float* inp,
                      const Conv2dShape& s) {
  guarded("backward (weights)", s, [&] {
    BackwardWeights& e = backward_weights_entry(s, dbias != nullptr);
    // oneDNN always produces the weight gradient; a caller that wants only the bias's gets it
    // computed into a scratch array.
    std::vector<float> scratch;
    if (dweight == nullptr) {
      scratch.resize(static_cast<size_t>(s.weight_numel()));
      dweight = scratch.data();
    }
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, e.src.in(inp)},
                                         {DNNL_ARG_DIFF_DST, e.ddst.in(dout)},
                                         {DNNL_ARG_DIFF_WEIGHTS, e.dwei.out(dweight)}};
    if (dbias != nullptr) args.emplace(DNNL_ARG_DIFF_BIAS, e.dbias->out(dbias));
    e.prim.execute(onednn_stream(), args);
    e.dwei.finish();
    if (dbias != nullptr) e.dbias->finish();
    onednn_stream().wait();
  });
}

ConvCacheStats cache_stats() {
  const Cache& c = cache();
  return {static_cast<int64_t>(c.size()), c.created};
}

std::string config() {
  const dnnl_version_t* v = dnnl_version();
  std::string isa;
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      isa = "sse41";
      break;
    case dnnl_cpu_isa_avx:
      isa = "avx";
      break;
    case dnnl_cpu_isa_avx2:
      isa = "avx2";
      break;
    case dnnl_cpu_isa_avx2_vnni:
      isa = "avx2_vnni";
      break;
    case dnnl_cpu_isa_avx512_core:
      isa = "avx512_core";
      break;
    case dnnl_cpu_isa_avx512_core_vnni:
      isa = "avx512_core_vnni";
      break;
    case dnnl_cpu_isa_avx512_core_bf16:
      isa = "avx512_core_bf16";
      break;
    case dnnl_cpu_isa_avx512_core_amx:
      isa = "avx512_core_amx";
      break;
    default:
      isa = "other";
      break;
  }
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (" + isa + ")";
}

}  // namespace meshtrain::cpu::conv2d_onednn
