// Config loading: the schema table generated from the key lists, TOML and JSON readers that go
// through one typed assignment path, and a deterministic TOML writer used for dumps and hashes.
#include "meshtrain/runtime/config.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <optional>
#include <sstream>

#include <toml++/toml.h>

#include "meshtrain/runtime/config_constraint.h"
#include "meshtrain/runtime/resolved_config.h"
#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::runtime {

namespace {

template <typename T>
constexpr ConfigType type_of() {
  if constexpr (std::is_same_v<T, int64_t>) return ConfigType::kInt;
  if constexpr (std::is_same_v<T, double>) return ConfigType::kFloat;
  if constexpr (std::is_same_v<T, bool>) return ConfigType::kBool;
  if constexpr (std::is_same_v<T, std::string>) return ConfigType::kString;
}

#define MESHTRAIN_CONFIG_ENTRY(section, name, type, def, help) \
  ConfigKey{#section,        #name, #section "." #name,        \
            type_of<type>(), help,  [](TrainConfig& c) -> ConfigRef { return &c.section.name; }},

#define MESHTRAIN_CONFIG_GROUP_ENTRY(section, group, name, type, def, help) \
  ConfigKey{#section,                                                       \
            #group "." #name,                                               \
            #section "." #group "." #name,                                  \
            type_of<type>(),                                                \
            help,                                                           \
            [](TrainConfig& c) -> ConfigRef { return &c.section.group##_##name; }},

// A group's keys follow their section's, so that the TOML dump writes each section once.
const std::vector<ConfigKey> kSchema = {
    MESHTRAIN_CONFIG_MODEL(MESHTRAIN_CONFIG_ENTRY)
        MESHTRAIN_CONFIG_MODEL_MOE(MESHTRAIN_CONFIG_GROUP_ENTRY)
            MESHTRAIN_CONFIG_DATA(MESHTRAIN_CONFIG_ENTRY)
                MESHTRAIN_CONFIG_OPTIM(MESHTRAIN_CONFIG_ENTRY)
                    MESHTRAIN_CONFIG_TRAIN(MESHTRAIN_CONFIG_ENTRY)
                        MESHTRAIN_CONFIG_DIST(MESHTRAIN_CONFIG_ENTRY)
                            MESHTRAIN_CONFIG_PARALLEL(MESHTRAIN_CONFIG_ENTRY)
                                MESHTRAIN_CONFIG_PARALLEL_PS(MESHTRAIN_CONFIG_GROUP_ENTRY)
                                    MESHTRAIN_CONFIG_PARALLEL_GOSSIP(MESHTRAIN_CONFIG_GROUP_ENTRY)
                                        MESHTRAIN_CONFIG_ELASTIC(MESHTRAIN_CONFIG_ENTRY)
                                            MESHTRAIN_CONFIG_CKPT(MESHTRAIN_CONFIG_ENTRY)};

#undef MESHTRAIN_CONFIG_GROUP_ENTRY
#undef MESHTRAIN_CONFIG_ENTRY

const char* article(ConfigType type) {
  return type == ConfigType::kInt ? "an " : "a ";
}

// A value from any source, before it is checked against the key's type.
using RawValue = std::variant<int64_t, double, bool, std::string>;

std::string raw_str(const RawValue& v) {
  return std::visit(
      [](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) return "\"" + x + "\" (a string)";
        if constexpr (std::is_same_v<T, bool>) return x ? "true (a boolean)" : "false (a boolean)";
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(x) + " (an integer)";
        if constexpr (std::is_same_v<T, double>) {
          std::ostringstream os;
          os << x << " (a float)";
          return os.str();
        }
      },
      v);
}

// `origin` says where the value came from ("config file F", "--set k=v") for error messages.
void assign(TrainConfig& config, const ConfigKey& key, const RawValue& value,
            const std::string& origin) {
  auto mismatch = [&]() {
    MT_THROW(ValueError, origin, ": key '", key.key, "' expects ", article(key.type),
             config_type_name(key.type), ", got ", raw_str(value));
  };
  ConfigRef ref = key.ref(config);
  switch (key.type) {
    case ConfigType::kInt:
      if (!std::holds_alternative<int64_t>(value)) mismatch();
      *std::get<int64_t*>(ref) = std::get<int64_t>(value);
      break;
    case ConfigType::kFloat:
      if (std::holds_alternative<int64_t>(value)) {
        *std::get<double*>(ref) = static_cast<double>(std::get<int64_t>(value));
      } else if (std::holds_alternative<double>(value)) {
        *std::get<double*>(ref) = std::get<double>(value);
      } else {
        mismatch();
      }
      break;
    case ConfigType::kBool:
      if (!std::holds_alternative<bool>(value)) mismatch();
      *std::get<bool*>(ref) = std::get<bool>(value);
      break;
    case ConfigType::kString:
      if (!std::holds_alternative<std::string>(value)) mismatch();
      *std::get<std::string*>(ref) = std::get<std::string>(value);
      break;
  }
}

[[noreturn]] void unknown_key(std::string_view key, const std::string& origin) {
  std::string suggestion = suggest_config_key(key);
  MT_THROW(ValueError, origin, ": unknown config key '", key, "'",
           suggestion.empty() ? std::string() : " (did you mean '" + suggestion + "'?)");
}

const ConfigKey& known_key(std::string_view key, const std::string& origin) {
  const ConfigKey* k = find_config_key(key);
  if (k == nullptr) unknown_key(key, origin);
  return *k;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

std::optional<RawValue> toml_value(const toml::node& node) {
  if (auto v = node.as_integer()) return RawValue{v->get()};
  if (auto v = node.as_floating_point()) return RawValue{v->get()};
  if (auto v = node.as_boolean()) return RawValue{v->get()};
  if (auto v = node.as_string()) return RawValue{v->get()};
  return std::nullopt;
}

// The keys of one table, named under `prefix` ("model"); a table that is not a key's value is a
// group of keys ([model.moe], or moe.every = ... under [model]).
void apply_toml_table(TrainConfig& config, const toml::table& table, const std::string& prefix,
                      const std::string& origin) {
  for (const auto& [name_key, node] : table) {
    const std::string full = prefix + "." + std::string(name_key.str());
    if (const toml::table* group = node.as_table();
        group != nullptr && find_config_key(full) == nullptr) {
      apply_toml_table(config, *group, full, origin);
      continue;
    }
    const ConfigKey& key = known_key(full, origin);
    std::optional<RawValue> value = toml_value(node);
    if (!value) {
      MT_THROW(ValueError, origin, ": key '", full, "' expects ", article(key.type),
               config_type_name(key.type), ", got ",
               node.is_array()   ? "an array"
               : node.is_table() ? "a table"
                                 : "a date/time");
    }
    assign(config, key, *value, origin);
  }
}

// Walks a parsed TOML table; dotted keys and [section] tables both arrive as nested tables.
void apply_toml(TrainConfig& config, const toml::table& root, const std::string& origin) {
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const toml::table* table = section_node.as_table();
    if (table == nullptr) unknown_key(section, origin);
    apply_toml_table(config, *table, section, origin);
  }
}

[[noreturn]] void bad_text(const ConfigKey& key, std::string_view text, const std::string& origin) {
  MT_THROW(ValueError, origin, ": key '", key.key, "' expects ", article(key.type),
           config_type_name(key.type), ", got '", text, "'");
}

RawValue parse_text_value(const ConfigKey& key, std::string_view text, const std::string& origin) {
  const char* end = text.data() + text.size();
  if (key.type == ConfigType::kInt) {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec != std::errc() || p != end || text.empty()) bad_text(key, text, origin);
    return v;
  }
  if (key.type == ConfigType::kFloat) {
    double v = 0;
    auto [p, ec] = std::from_chars(text.data(), end, v);
    if (ec != std::errc() || p != end || text.empty()) bad_text(key, text, origin);
    return v;
  }
  if (key.type == ConfigType::kBool) {
    if (text == "true" || text == "1") return true;
    if (text == "false" || text == "0") return false;
    bad_text(key, text, origin);
  }
  if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
      text.back() == text.front()) {
    text = text.substr(1, text.size() - 2);
  }
  return std::string(text);
}

std::string toml_string(std::string_view s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

std::string toml_float(double v) {
  char buf[64];
  auto [p, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  std::string s(buf, p);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // "n": inf, nan
  return s;
}

}  // namespace

std::string_view config_type_name(ConfigType type) {
  switch (type) {
    case ConfigType::kInt:
      return "integer";
    case ConfigType::kFloat:
      return "float";
    case ConfigType::kBool:
      return "boolean";
    case ConfigType::kString:
      return "string";
  }
  return "?";
}

const std::vector<ConfigKey>& config_schema() {
  return kSchema;
}

const ConfigKey* find_config_key(std::string_view key) {
  for (const ConfigKey& k : kSchema) {
    if (k.key == key) return &k;
  }
  return nullptr;
}

std::string suggest_config_key(std::string_view unknown) {
  // The right name in the wrong section ("train.lr") is the most common slip: prefer it.
  std::string_view bare =
      unknown.substr(unknown.rfind('.') == std::string_view::npos ? 0 : unknown.rfind('.') + 1);
  for (const ConfigKey& k : kSchema) {
    if (k.name == bare) return std::string(k.key);
  }
  const ConfigKey* best = nullptr;
  size_t best_d = SIZE_MAX;
  for (const ConfigKey& k : kSchema) {
    size_t d = std::min(edit_distance(unknown, k.key), edit_distance(bare, k.name));
    if (d < best_d) {
      best_d = d;
      best = &k;
    }
  }
  if (best == nullptr || best_d > std::max<size_t>(2, bare.size() / 3)) return "";
  return std::string(best->key);
}

void apply_override(TrainConfig& config, std::string_view assignment) {
  const std::string origin = "--set " + std::string(assignment);
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    MT_THROW(ValueError, origin, ": expected section.key=value, e.g. --set model.n_layer=4");
  }
  auto trim = [](std::string_view s) {
    while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
    while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
    return s;
  };
  const std::string_view key_text = trim(assignment.substr(0, eq));
  const ConfigKey& key = known_key(key_text, origin);
  assign(config, key, parse_text_value(key, trim(assignment.substr(eq + 1)), origin), origin);
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  TrainConfig config;
  if (!path.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_regular_file(path, ec)) {
      MT_THROW(IoError, "config file ", path, " does not exist or is not a regular file");
    }
    toml::table root;
    try {
      root = toml::parse_file(path);
    } catch (const toml::parse_error& e) {
      MT_THROW(ValueError, "config file ", path, ":", e.source().begin.line, ":",
               e.source().begin.column, ": ", e.description());
    }
    apply_toml(config, root, "config file " + path);
  }
  for (const std::string& o : overrides) apply_override(config, o);
  validate(config);
  return config;
}

std::optional<uint64_t> parse_memory_limit(const std::string& text, std::string_view key) {
  if (text == "auto" || text == "off") return std::nullopt;
  auto bad = [&]() {
    MT_THROW(ValueError, "config: ", key, " = \"", text,
             "\" is not a size; use auto, off, or a number with a unit like 8GiB, 512MiB, 2GB");
  };
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    bad();
  }
  std::string unit = text.substr(end);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult = 0;
  if (unit == "B") mult = 1;
  if (unit == "KiB") mult = 1024.0;
  if (unit == "MiB") mult = 1024.0 * 1024;
  if (unit == "GiB") mult = 1024.0 * 1024 * 1024;
  if (unit == "TiB") mult = 1024.0 * 1024 * 1024 * 1024;
  if (unit == "KB") mult = 1e3;
  if (unit == "MB") mult = 1e6;
  if (unit == "GB") mult = 1e9;
  if (unit == "TB") mult = 1e12;
  if (!(mult > 0) || !(v > 0) || !std::isfinite(v)) bad();
  return static_cast<uint64_t>(v * mult);
}

void validate(const TrainConfig& c) {
  (void)resolve_config(c);
}

std::string config_value_str(const TrainConfig& config, const ConfigKey& key) {
  ConfigRef ref = key.ref(const_cast<TrainConfig&>(config));  // read only
  return std::visit(
      [](auto* p) -> std::string {
        using T = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<T, int64_t>) return std::to_string(*p);
        if constexpr (std::is_same_v<T, double>) return toml_float(*p);
        if constexpr (std::is_same_v<T, bool>) return *p ? "true" : "false";
        if constexpr (std::is_same_v<T, std::string>) return toml_string(*p);
      },
      ref);
}

std::string to_toml(const TrainConfig& config) {
  std::string out;
  std::string_view section;
  for (const ConfigKey& k : kSchema) {
    if (k.section != section) {
      if (!section.empty()) out += "\n";
      section = k.section;
      out.append("[").append(section).append("]\n");
    }
    out.append(k.name).append(" = ").append(config_value_str(config, k)).append("\n");
  }
  return out;
}

nlohmann::ordered_json to_json(const TrainConfig& config) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const ConfigKey& k : kSchema) {
    auto& slot = j[std::string(k.section)][std::string(k.name)];
    std::visit([&](auto* p) { slot = *p; }, k.ref(const_cast<TrainConfig&>(config)));
  }
  return j;
}

TrainConfig config_from_json(const nlohmann::json& json) {
  const std::string origin = "config JSON";
  TrainConfig config;
  if (!json.is_object()) MT_THROW(ValueError, origin, ": not an object");
  for (const auto& [section, table] : json.items()) {
    if (!table.is_object()) unknown_key(section, origin);
    for (const auto& [name, v] : table.items()) {
      const ConfigKey& key = known_key(section + "." + name, origin);
      RawValue value;
      if (v.is_number_integer()) {
        value = v.get<int64_t>();
      } else if (v.is_number_float()) {
        value = v.get<double>();
      } else if (v.is_boolean()) {
        value = v.get<bool>();
      } else if (v.is_string()) {
        value = v.get<std::string>();
      } else {
        MT_THROW(ValueError, origin, ": key '", key.key, "' has unsupported value ", v.dump());
      }
      assign(config, key, value, origin);
    }
  }
  validate(config);
  return config;
}

uint64_t config_hash(const TrainConfig& config) {
  return xxh3_64(to_toml(config));
}

std::string config_help() {
  const TrainConfig defaults;
  size_t width = 0;
  for (const ConfigKey& k : kSchema) {
    width = std::max(width, k.key.size() + 3 + config_value_str(defaults, k).size());
  }
  std::string out;
  for (const ConfigKey& k : kSchema) {
    std::string lhs = std::string(k.key) + " = " + config_value_str(defaults, k);
    lhs.resize(width, ' ');
    out += "  " + lhs + "  (" + std::string(config_type_name(k.type)) + ") " + std::string(k.help);
    if (const ConfigConstraint* c = find_config_constraint(k.key))
      out += " [" + describe_constraint(*c) + "]";
    out += "\n";
  }
  return out;
}

}  // namespace meshtrain::runtime
