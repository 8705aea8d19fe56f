// The comm-hook interface, the two stateless hooks and the factory that parses hook names.
#include "meshtrain/parallel/ddp/comm_hook.h"

#include <charconv>
#include <cmath>

#include "meshtrain/parallel/ddp/powersgd_hook.h"
#include "meshtrain/parallel/ddp/topk_hook.h"

namespace meshtrain::parallel {

int64_t BucketParam::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<BucketParam> bucket_params(const GradBucket& bucket) {
  if (!bucket.params.empty()) return bucket.params;
  BucketParam p;
  p.name = "bucket" + std::to_string(bucket.index);
  p.shape = {bucket.buffer.numel()};
  return {p};
}

void CommHook::load_state_dict(const nn::NamedTensors& state) {
  if (!state.empty())
    MT_THROW(ValueError, "comm hook '", name(), "' keeps no state, but the state to load has '",
             state.front().first, "'");
}

comm::WorkPtr AllReduceHook::launch(GradBucket& bucket, comm::ProcessGroup& pg) {
  return pg.all_reduce(bucket.buffer.data_ptr(), static_cast<size_t>(bucket.buffer.numel()),
                       DType::f32, {.op = comm::ReduceOp::avg});
}

HalfPrecisionHook::HalfPrecisionHook(DType dtype) : dtype_(dtype) {
  MT_CHECK(dtype == DType::bf16 || dtype == DType::f16, "half-precision hook needs bf16 or f16");
}

std::string HalfPrecisionHook::name() const {
  return std::string(dtype_name(dtype_));
}

comm::WorkPtr HalfPrecisionHook::launch(GradBucket& bucket, comm::ProcessGroup& pg) {
  if (staging_.size() <= static_cast<size_t>(bucket.index)) staging_.resize(bucket.index + 1);
  Tensor& s = staging_[static_cast<size_t>(bucket.index)];
  if (!s.defined() || s.numel() != bucket.buffer.numel())
    s = Tensor::empty(bucket.buffer.shape(), dtype_, bucket.buffer.device());
  s.copy_(bucket.buffer);
  return pg.all_reduce(s.data_ptr(), static_cast<size_t>(s.numel()), dtype_);
}

void HalfPrecisionHook::finish(GradBucket& bucket) {
  bucket.buffer.copy_(staging_[static_cast<size_t>(bucket.index)]);
}

namespace {

// "family:param" -> ("family", "param"); no colon -> ("family", "").
std::pair<std::string, std::string> split_spec(const std::string& name) {
  const size_t colon = name.find(':');
  if (colon == std::string::npos) return {name, ""};
  return {name.substr(0, colon), name.substr(colon + 1)};
}

double parse_ratio(const std::string& name, const std::string& text) {
  double v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || !std::isfinite(v) || v <= 0 || v > 1)
    MT_THROW(ValueError, "comm hook '", name, "': the top-k ratio must be a number in (0, 1]");
  return v;
}

int parse_rank(const std::string& name, const std::string& text) {
  int v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < 1 || v > 1024)
    MT_THROW(ValueError, "comm hook '", name,
             "': the PowerSGD rank must be an integer in [1, 1024]");
  return v;
}

int64_t parse_count(const std::string& name, const std::string& text) {
  int64_t v = 0;
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || p != end || v < 0)
    MT_THROW(ValueError, "comm hook '", name,
             "': the PowerSGD warm-up must be a non-negative number of steps");
  return v;
}

}  // namespace

CommHookSpec parse_comm_hook_spec(const std::string& name) {
  CommHookSpec spec;
  if (name == "allreduce" || name == "none" || name.empty()) return spec;
  if (name == "bf16" || name == "f16") {
    spec.kind = name == "bf16" ? CommHookKind::bf16 : CommHookKind::f16;
    return spec;
  }
  const auto [family, param] = split_spec(name);
  const bool has_param = name.find(':') != std::string::npos;
  if (family == "topk") {
    spec.kind = CommHookKind::topk;
    if (has_param) spec.topk_ratio = parse_ratio(name, param);
    return spec;
  }
  if (family == "powersgd") {
    spec.kind = CommHookKind::powersgd;
    if (has_param) {
      const auto [rank, warmup] = split_spec(param);
      spec.powersgd_rank = parse_rank(name, rank);
      if (param.find(':') != std::string::npos) spec.powersgd_warmup = parse_count(name, warmup);
    }
    return spec;
  }
  std::string names;
  for (const std::string& n : comm_hook_names()) names += (names.empty() ? "" : ", ") + n;
  MT_THROW(ValueError, "unknown comm hook '", name, "' (expected one of ", names, "; ",
           comm_hook_forms(), ")");
}

std::unique_ptr<CommHook> make_comm_hook(const CommHookSpec& spec) {
  switch (spec.kind) {
    case CommHookKind::allreduce:
      return std::make_unique<AllReduceHook>();
    case CommHookKind::bf16:
      return std::make_unique<HalfPrecisionHook>(DType::bf16);
    case CommHookKind::f16:
      return std::make_unique<HalfPrecisionHook>(DType::f16);
    case CommHookKind::topk: {
      TopKOptions o;
      if (spec.topk_ratio) o.ratio = *spec.topk_ratio;
      return std::make_unique<TopKHook>(o);
    }
    case CommHookKind::powersgd: {
      PowerSGDOptions o;
      if (spec.powersgd_rank) o.rank = *spec.powersgd_rank;
      if (spec.powersgd_warmup) o.warmup_steps = *spec.powersgd_warmup;
      return std::make_unique<PowerSGDHook>(o);
    }
  }
  MT_CHECK(false, "unknown comm hook kind ", static_cast<int>(spec.kind));
  return nullptr;
}

std::unique_ptr<CommHook> make_comm_hook(const std::string& name) {
  return make_comm_hook(parse_comm_hook_spec(name));
}

const std::vector<std::string>& comm_hook_names() {
  static const std::vector<std::string> kNames = {"allreduce", "bf16", "f16", "topk", "powersgd"};
  return kNames;
}

std::string_view comm_hook_forms() {
  return "topk[:RATIO], powersgd[:RANK[:WARMUP]]";
}

}  // namespace meshtrain::parallel
