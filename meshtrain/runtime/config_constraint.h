// The allowed values of the config keys that have a limit: a choice among names, or a numeric
// range. One line per key in config_constraint.cpp, beside the key list of config.h (which stays
// a one-line-per-key list that others extend in parallel): validate(), `--help-config` and the
// docs read this one table, so they cannot drift. A key without a line takes any value of its
// type; cross-key rules (n_embd divisible by n_head, ZeRO with a compressing hook) stay in
// validate().
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/runtime/config.h"

namespace meshtrain::runtime {

struct ConfigConstraint {
  std::string_view key;  // "optim.name"
  // A choice (string keys): the allowed names. With `parametric`, a value may carry arguments
  // after a colon ("topk:0.01") and only the part before it is a choice; `forms` shows them.
  std::vector<std::string> choices;
  // Where the choices are another registry's names (dist.backend: the collective backends this
  // build knows), computed on use instead of listed.
  std::vector<std::string> (*choices_from)() = nullptr;
  bool parametric = false;
  std::string_view forms;  // "topk[:RATIO], powersgd[:RANK[:WARMUP]]"
  // A choice whose other values are something else the key's consumer reads (ckpt.resume_from:
  // a checkpoint path): what they are, for help. Such a key never rejects a value here.
  std::string_view otherwise;
  // A range (numeric keys): lo and/or hi, each closed or open. A float outside, NaN or an
  // infinity where a bound is open on that side is rejected.
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  std::string_view note;  // why, for the range ("0 = off")

  bool is_choice() const { return !choices.empty() || choices_from != nullptr; }
  std::vector<std::string> allowed_names() const;
};

// Every constraint, in the order of the keys in config.h.
const std::vector<ConfigConstraint>& config_constraints();
// nullptr when the key has no constraint.
const ConfigConstraint* find_config_constraint(std::string_view key);

// The allowed set as help and errors write it: "one of: adamw, sgd", "at least 1", ">= 0",
// "in [0, 1)", "> 1".
std::string describe_constraint(const ConfigConstraint& c);

// Checks every constrained key of `config`. A bad value is one ValueError line naming the key,
// the value and the allowed set:
//   config: optim.name = "adam" is not one of: adamw, sgd
//   config: optim.beta2 must be in [0, 1), got 1.5
void check_config_constraints(const TrainConfig& config);

// The choice check for a rule the table cannot hold (a choice that depends on another key):
// "config: KEY = "VALUE" is not one of: A, B". A key's own choices belong in the table.
void check_choice(const std::string& value, std::string_view key,
                  std::initializer_list<std::string_view> choices);

}  // namespace meshtrain::runtime
