#include "meshtrain/runtime/config_choice.h"

#include <algorithm>

#include "meshtrain/runtime/config_constraint.h"
#include "meshtrain/util/error.h"

namespace meshtrain::runtime {

size_t config_choice_index(std::string_view key, const std::string& value) {
  const ConfigConstraint* c = find_config_constraint(key);
  MT_CHECK(c != nullptr && c->is_choice(), "config: ", key, " has no choices in the table");
  const std::string name = c->parametric ? value.substr(0, value.find(':')) : value;
  const std::vector<std::string> names = c->allowed_names();
  const auto it = std::find(names.begin(), names.end(), name);
  if (it == names.end())
    MT_THROW(ValueError, "config: ", key, " = \"", value, "\" is not ", describe_constraint(*c));
  return static_cast<size_t>(it - names.begin());
}

namespace {

template <typename E>
E choice(std::string_view key, const std::string& value) {
  return static_cast<E>(config_choice_index(key, value));
}

}  // namespace

ConfigChoices parse_config_choices(const TrainConfig& c) {
  ConfigChoices out;
  out.optimizer = choice<OptimizerChoice>("optim.name", c.optim.name);
  out.lr_scale_rule = choice<LrScaleRule>("optim.lr_scale_rule", c.optim.lr_scale_rule);
  out.device = choice<DeviceKind>("train.device", c.train.device);
  out.log_format = choice<LogFormatChoice>("train.log_format", c.train.log_format);
  out.gemm = choice<GemmChoice>("train.gemm", c.train.gemm);
  out.precision = choice<PrecisionChoice>("train.precision", c.train.precision);
  out.elastic_batch = choice<ElasticBatchChoice>("dist.elastic_batch", c.dist.elastic_batch);
  out.fsdp_unit = choice<FsdpUnit>("parallel.fsdp_unit", c.parallel.fsdp_unit);
  out.on_error = choice<OnSaveError>("ckpt.on_error", c.ckpt.on_error);
  out.model = choice<ModelKind>("model.kind", c.model.kind);
  out.data = choice<DataKind>("data.kind", c.data.kind);
  // A path where it is neither name; the table lists the names.
  const ConfigConstraint* from = find_config_constraint("ckpt.resume_from");
  const std::vector<std::string> names = from->allowed_names();
  const auto it = std::find(names.begin(), names.end(), c.ckpt.resume_from);
  out.resume_from =
      it == names.end() ? ResumeFrom::path : static_cast<ResumeFrom>(it - names.begin());
  return out;
}

}  // namespace meshtrain::runtime
