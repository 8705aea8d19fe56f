// See config_constraint.h. The table: one line per constrained key, in config.h's order.
#include "meshtrain/runtime/config_constraint.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/cuda/nccl/nccl_backend.h"
#include "meshtrain/parallel/ddp/comm_hook.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

ConfigConstraint one_of(std::string_view key, std::vector<std::string> names) {
  ConfigConstraint c;
  c.key = key;
  c.choices = std::move(names);
  return c;
}
// A name, optionally followed by ":ARGS" that the key's own parser reads.
ConfigConstraint one_of_with_args(std::string_view key, std::vector<std::string> names,
                                  std::string_view forms) {
  ConfigConstraint c = one_of(key, std::move(names));
  c.parametric = true;
  c.forms = forms;
  return c;
}
// Names with a meaning, any other value being `otherwise` ("a checkpoint path").
ConfigConstraint one_of_or(std::string_view key, std::vector<std::string> names,
                           std::string_view otherwise) {
  ConfigConstraint c = one_of(key, std::move(names));
  c.otherwise = otherwise;
  return c;
}
ConfigConstraint range(std::string_view key, std::optional<double> lo, bool lo_open,
                       std::optional<double> hi, bool hi_open, std::string_view note = {}) {
  ConfigConstraint c;
  c.key = key;
  c.lo = lo;
  c.lo_open = lo_open;
  c.hi = hi;
  c.hi_open = hi_open;
  c.note = note;
  return c;
}
ConfigConstraint at_least(std::string_view key, double lo, std::string_view note = {}) {
  return range(key, lo, false, std::nullopt, false, note);
}
ConfigConstraint above(std::string_view key, double lo, std::string_view note = {}) {
  return range(key, lo, true, std::nullopt, false, note);
}
// [lo, hi), the usual bound of a probability or decay.
ConfigConstraint fraction(std::string_view key) {
  return range(key, 0.0, false, 1.0, true);
}

// "auto" and every backend the registry holds, nccl included where this build has it.
std::vector<std::string> backend_names() {
  (void)cuda::register_nccl_backend();
  std::vector<std::string> names = comm::registered_backends();
  auto a = std::find(names.begin(), names.end(), "auto");
  if (a != names.end()) names.erase(a);
  names.insert(names.begin(), "auto");
  return names;
}

const std::vector<ConfigConstraint>& table() {
  static const std::vector<ConfigConstraint> kTable = [] {
    std::vector<ConfigConstraint> t = {
        one_of("model.kind", {"gpt", "mlp", "resnet"}),
        at_least("model.n_layer", 1),
        at_least("model.n_head", 1),
        at_least("model.n_embd", 1),
        at_least("model.block_size", 1),
        at_least("model.vocab_size", 1),
        fraction("model.dropout"),
        one_of("model.resnet", {"small", "tiny", "resnet18", "resnet50"}),
        at_least("model.moe.every", 0, "0 = none"),
        at_least("model.moe.num_experts", 1),
        range("model.moe.top_k", 1.0, false, 2.0, false),
        at_least("model.moe.expert_hidden", 0, "0 = 4 x model.n_embd"),
        above("model.moe.capacity_factor", 0),
        above("model.moe.eval_capacity_factor", 0),
        at_least("model.moe.min_capacity", 0),
        at_least("model.moe.aux_loss_weight", 0),
        at_least("model.moe.z_loss_weight", 0),
        at_least("model.moe.bias_update_rate", 0, "0 = off"),
        one_of("model.moe.router_balance", {"none", "batch"}),
        one_of("model.moe.router_noise", {"none", "jitter", "rsample"}),
        range("model.moe.jitter_eps", 0.0, false, 1.0, true),
        one_of("data.kind", {"tokens", "spirals", "fashion_mnist"}),
        at_least("data.batch_size", 1),
        at_least("data.val_batches", 0),
        at_least("data.shard_block", 0),
        at_least("data.prefetch_shards", 0),
        at_least("data.samples", 1),
        at_least("data.classes", 2),
        one_of("optim.name", {"adamw", "sgd"}),
        above("optim.lr", 0),
        at_least("optim.weight_decay", 0),
        fraction("optim.beta1"),
        fraction("optim.beta2"),
        above("optim.eps", 0),
        fraction("optim.momentum"),
        at_least("optim.grad_clip", 0, "0 = off"),
        one_of("optim.schedule", {"cosine", "linear", "constant", "one_cycle"}),
        at_least("optim.warmup_steps", 0),
        range("optim.min_lr_ratio", 0.0, false, 1.0, false),
        range("optim.pct_start", 0.0, true, 1.0, true),
        one_of("optim.lr_scale_rule", {"none", "linear", "sqrt"}),
        at_least("train.steps", 0),
        at_least("train.eval_interval", 0, "0 = only at the end"),
        at_least("train.log_interval", 1),
        fraction("train.label_smoothing"),
        at_least("train.threads", 0, "0 = all cores"),
        one_of_with_args("train.device", {"cpu", "cuda"}, "cuda:N"),
        at_least("train.sample_tokens", 0),
        at_least("train.grad_accum_steps", 1),
        one_of("train.log_format", {"text", "json"}),
        one_of("train.gemm", {"onednn", "openblas"}),
        at_least("train.rollback_after", 0, "0 = off"),
        at_least("train.max_rollbacks", 0),
        range("train.rollback_lr_factor", 0.0, true, 1.0, false),
        range("train.spike_zscore", 0.0, false, kInf, true, "0 = off"),
        one_of("train.precision", {"f32", "bf16", "f16"}),
        range("train.loss_scale_init", 0.0, true, kInf, true),
        range("train.loss_scale_growth_factor", 1.0, true, kInf, true),
        range("train.loss_scale_backoff_factor", 0.0, true, 1.0, true),
        at_least("train.loss_scale_growth_interval", 1),
        above("dist.timeout_s", 0),
        above("dist.bucket_mb", 0),
        above("dist.first_bucket_mb", 0),
        one_of_with_args("dist.comm_hook", parallel::comm_hook_names(),
                         parallel::comm_hook_forms()),
        at_least("dist.check_interval", 0, "0 = off"),
        one_of("dist.elastic_batch", {"keep", "rescale_lr"}),
        range("parallel.zero_stage", 0.0, false, 3.0, false, "0 = DDP"),
        one_of("parallel.fsdp_unit", {"block", "model"}),
        one_of("parallel.schedule", {"gpipe", "1f1b", "interleaved"}),
        one_of("parallel.partition", {"flops", "params"}),
        one_of("parallel.mode", {"ddp", "parameter_server", "gossip"}),
        at_least("parallel.ep", 1),
        at_least("data.crop_padding", 0),
        at_least("parallel.ps.servers", 1),
        one_of("parallel.ps.consistency", {"sync", "async", "ssp"}),
        at_least("parallel.ps.staleness", 0),
        at_least("parallel.ps.backup_workers", 0),
        one_of("parallel.gossip.graph", {"ring", "exponential"}),
        at_least("elastic.straggler_factor", 0, "0 = off"),
        at_least("elastic.straggler_steps", 1),
        at_least("ckpt.interval", 0, "0 = off"),
        at_least("ckpt.keep_last", 0, "0 = all"),
        at_least("ckpt.keep_every", 0, "0 = none"),
        at_least("ckpt.max_snapshot_mb", 0),
        at_least("ckpt.interval_minutes", 0, "0 = off"),
        one_of("ckpt.on_error", {"stop", "continue"}),
        one_of_or("ckpt.resume_from", {"latest", "best"},
                  "a checkpoint step directory or pointer file path"),
    };
    ConfigConstraint backend;
    backend.key = "dist.backend";
    backend.choices_from = backend_names;
    t.push_back(backend);
    return t;
  }();
  return kTable;
}

std::string number(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : ", ") + n;
  return out;
}

}  // namespace

std::vector<std::string> ConfigConstraint::allowed_names() const {
  return choices_from != nullptr ? choices_from() : choices;
}

const std::vector<ConfigConstraint>& config_constraints() {
  return table();
}

const ConfigConstraint* find_config_constraint(std::string_view key) {
  for (const ConfigConstraint& c : table()) {
    if (c.key == key) return &c;
  }
  return nullptr;
}

std::string describe_constraint(const ConfigConstraint& c) {
  if (c.is_choice()) {
    std::string out = "one of: " + join(c.allowed_names());
    if (!c.forms.empty()) out += " (" + std::string(c.forms) + ")";
    if (!c.otherwise.empty()) out += ", or " + std::string(c.otherwise);
    return out;
  }
  std::string out;
  const bool finite_hi = c.hi && std::isfinite(*c.hi);
  if (c.lo && finite_hi) {
    out = detail::str_cat("in ", c.lo_open ? "(" : "[", number(*c.lo), ", ", number(*c.hi),
                          c.hi_open ? ")" : "]");
  } else if (c.lo) {
    out = detail::str_cat(c.lo_open ? "> " : ">= ", number(*c.lo), c.hi ? " and finite" : "");
  } else if (finite_hi) {
    out = detail::str_cat(c.hi_open ? "< " : "<= ", number(*c.hi));
  }
  if (!c.note.empty()) out += " (" + std::string(c.note) + ")";
  return out;
}

void check_config_constraints(const TrainConfig& config) {
  for (const ConfigConstraint& c : table()) {
    const ConfigKey* key = find_config_key(c.key);
    MT_CHECK(key != nullptr, "config constraint for unknown key ", c.key);
    const ConfigRef ref = key->ref(const_cast<TrainConfig&>(config));  // read only
    if (c.is_choice()) {
      const auto* text = std::get_if<std::string*>(&ref);
      MT_CHECK(text != nullptr, "config constraint: ", c.key, " is not a string key");
      const std::string& value = **text;
      const std::string name = c.parametric ? value.substr(0, value.find(':')) : value;
      const auto names = c.allowed_names();
      if (c.otherwise.empty() && std::find(names.begin(), names.end(), name) == names.end())
        MT_THROW(ValueError, "config: ", c.key, " = \"", value, "\" is not ",
                 describe_constraint(c));
      continue;
    }
    double v = 0;
    std::string shown;
    if (const auto* i = std::get_if<int64_t*>(&ref)) {
      v = static_cast<double>(**i);
      shown = std::to_string(**i);
    } else if (const auto* d = std::get_if<double*>(&ref)) {
      v = **d;
      shown = number(v);
    } else {
      MT_CHECK(false, "config constraint: ", c.key, " is not a numeric key");
    }
    const bool low_ok = !c.lo || (c.lo_open ? v > *c.lo : v >= *c.lo);
    const bool high_ok = !c.hi || (c.hi_open ? v < *c.hi : v <= *c.hi);
    if (!(low_ok && high_ok) || std::isnan(v))
      MT_THROW(ValueError, "config: ", c.key, " must be ", describe_constraint(c), ", got ", shown);
  }
}

void check_choice(const std::string& value, std::string_view key,
                  std::initializer_list<std::string_view> choices) {
  for (std::string_view c : choices) {
    if (value == c) return;
  }
  std::string list;
  for (std::string_view c : choices) list += (list.empty() ? "" : ", ") + std::string(c);
  MT_THROW(ValueError, "config: ", key, " = \"", value, "\" is not one of: ", list);
}

}  // namespace meshtrain::runtime
