// See env_registry.h.
#include "meshtrain/util/env_registry.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <sstream>

#include "meshtrain/util/error.h"

extern char** environ;

namespace meshtrain {
namespace {

constexpr EnvSetting kSettings[] = {
#define MESHTRAIN_ENV_ENTRY(id, name, type, fallback, readers, meaning) \
  {Env::id, name, type, fallback, static_cast<uint8_t>(readers), meaning},
    MESHTRAIN_ENV_SETTINGS(MESHTRAIN_ENV_ENTRY)
#undef MESHTRAIN_ENV_ENTRY
};

constexpr std::string_view kPrefix = "MESHTRAIN_";

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::span<const EnvSetting> env_settings() {
  return kSettings;
}

const EnvSetting& env_setting(Env id) {
  const auto k = static_cast<size_t>(id);
  MT_CHECK(k < std::size(kSettings), "no environment setting number ", k);
  return kSettings[k];
}

const EnvSetting* find_env_setting(std::string_view name) {
  for (const EnvSetting& s : kSettings) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

std::optional<std::string> env_value(Env id) {
  const std::string name(env_name(id));
  const char* v = std::getenv(name.c_str());
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::string(v);
}

bool env_is_set(Env id) {
  const std::string name(env_name(id));
  return std::getenv(name.c_str()) != nullptr;
}

std::optional<uint64_t> env_count(Env id) {
  const EnvSetting& s = env_setting(id);
  MT_CHECK(s.type == "int" || s.type == "bytes" || s.type == "port", s.name, " is a ", s.type,
           ", not a number");
  const auto v = env_value(id);
  if (!v) return std::nullopt;
  uint64_t n = 0;
  const char* end = v->data() + v->size();
  auto [p, ec] = std::from_chars(v->data(), end, n);
  if (ec != std::errc() || p != end)
    MT_THROW(ValueError, "environment variable ", s.name, "='", *v, "' is not a whole number (",
             s.type, "); unset it or see `meshtrain env`");
  return n;
}

std::optional<double> env_real(Env id) {
  const EnvSetting& s = env_setting(id);
  MT_CHECK(s.type == "float", s.name, " is a ", s.type, ", not a float");
  const auto v = env_value(id);
  if (!v) return std::nullopt;
  double x = 0;
  const char* end = v->data() + v->size();
  auto [p, ec] = std::from_chars(v->data(), end, x);
  if (ec != std::errc() || p != end || !std::isfinite(x) || x < 0)
    MT_THROW(ValueError, "environment variable ", s.name, "='", *v,
             "' is not a non-negative number (float); unset it or see `meshtrain env`");
  return x;
}

std::string env_readers_text(uint8_t readers) {
  std::string out;
  auto add = [&](uint8_t bit, const char* what) {
    if ((readers & bit) == 0) return;
    if (!out.empty()) out += ", ";
    out += what;
  };
  add(kEnvLauncher, "meshrun");
  add(kEnvWorker, "meshtrain");
  add(kEnvScript, "script");
  add(kEnvTest, "tests");
  return out;
}

std::string_view closest_env_name(std::string_view name) {
  std::string_view best;
  size_t best_distance = SIZE_MAX;
  for (const EnvSetting& s : kSettings) {
    const size_t d = edit_distance(name, s.name);
    if (d < best_distance) {
      best_distance = d;
      best = s.name;
    }
  }
  return best;
}

std::vector<std::string> unknown_env_warnings(std::span<const std::string> environment) {
  std::vector<std::string> out;
  for (const std::string& entry : environment) {
    const std::string name = entry.substr(0, entry.find('='));
    if (!name.starts_with(kPrefix) || find_env_setting(name) != nullptr) continue;
    out.push_back(detail::str_cat("unknown environment variable ", name, " (did you mean ",
                                  closest_env_name(name),
                                  "? `meshtrain env` lists the known ones)"));
  }
  return out;
}

std::vector<std::string> unknown_env_warnings() {
  std::vector<std::string> environment;
  for (char** e = environ; *e != nullptr; ++e) environment.emplace_back(*e);
  return unknown_env_warnings(environment);
}

std::string env_report(bool include_test_only) {
  std::ostringstream out;
  out << "MESHTRAIN_* environment variables (current value, then type, default, who reads it):\n";
  for (const EnvSetting& s : kSettings) {
    const bool test_only = (s.readers & kEnvTest) != 0;
    if (test_only && !include_test_only) continue;
    const std::string name(s.name);
    const char* v = std::getenv(name.c_str());
    out << "  " << name << " = ";
    if (v == nullptr) {
      out << "(unset)";
    } else if (s.type == "secret") {
      out << "(set)";
    } else {
      out << '\'' << v << '\'';
    }
    out << "\n";
    out << "      " << s.type << ", default " << (s.fallback.empty() ? "none" : s.fallback)
        << ", read by " << env_readers_text(s.readers) << (test_only ? " (test only)" : "")
        << "\n      " << s.meaning << "\n";
  }
  return out.str();
}

}  // namespace meshtrain
