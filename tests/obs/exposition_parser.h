// A strict reader of the Prometheus text exposition format (0.0.4), written from the format's
// description independently of the renderer it checks: every line must be a HELP, a TYPE, a
// comment or a sample; names, label names and escapes must be valid; a family's TYPE comes before
// its samples, its samples are contiguous, and no series appears twice. Histograms must have
// cumulative buckets ending in le="+Inf" equal to _count, and a _sum.
#pragma once

#include <cmath>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace meshtrain::obs::testing {

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::map<std::string, std::string> types;
  std::map<std::string, std::string> helps;
  std::vector<Sample> samples;

  std::vector<Sample> find(const std::string& name,
                           const std::map<std::string, std::string>& subset = {}) const {
    std::vector<Sample> out;
    for (const auto& s : samples) {
      if (s.name != name) continue;
      bool ok = true;
      for (const auto& [k, v] : subset) {
        auto it = s.labels.find(k);
        ok = ok && it != s.labels.end() && it->second == v;
      }
      if (ok) out.push_back(s);
    }
    return out;
  }
};

class ParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

inline bool is_name_start(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
inline bool is_name_char(char c, bool colon) {
  return is_name_start(c, colon) || (c >= '0' && c <= '9');
}

inline std::string read_name(const std::string& line, size_t& i, bool colon) {
  const size_t start = i;
  if (i >= line.size() || !is_name_start(line[i], colon))
    throw ParseError("bad name at column " + std::to_string(i) + ": " + line);
  while (i < line.size() && is_name_char(line[i], colon)) ++i;
  return line.substr(start, i - start);
}

inline double parse_value(const std::string& s, const std::string& line) {
  if (s == "+Inf") return INFINITY;
  if (s == "-Inf") return -INFINITY;
  if (s == "NaN") return NAN;
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (...) {
    throw ParseError("bad value '" + s + "': " + line);
  }
  if (used != s.size()) throw ParseError("bad value '" + s + "': " + line);
  return v;
}

// The family a sample belongs to, given the declared types.
inline std::string family_of(const std::string& name, const std::map<std::string, std::string>& t) {
  for (const char* suffix : {"_bucket", "_sum", "_count"}) {
    const std::string sfx(suffix);
    if (name.size() > sfx.size() && name.compare(name.size() - sfx.size(), sfx.size(), sfx) == 0) {
      const std::string base = name.substr(0, name.size() - sfx.size());
      auto it = t.find(base);
      if (it != t.end() && (it->second == "histogram" || it->second == "summary")) return base;
    }
  }
  return name;
}

}  // namespace detail

inline Exposition parse_exposition(const std::string& text) {
  using namespace detail;
  Exposition out;
  if (!text.empty() && text.back() != '\n') throw ParseError("text must end with a newline");
  std::istringstream in(text);
  std::string line;
  std::set<std::string> finished;  // families whose group has ended
  std::string current;             // family of the previous sample
  std::set<std::string> series;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    if (line[0] == '#') {
      std::istringstream ls(line.substr(1));
      std::string kw;
      ls >> kw;
      if (kw != "HELP" && kw != "TYPE") continue;  // an ordinary comment
      size_t i = 1;
      while (i < line.size() && line[i] == ' ') ++i;
      i += 4;
      if (i >= line.size() || line[i] != ' ') throw ParseError("malformed: " + line);
      ++i;
      const std::string name = read_name(line, i, true);
      if (i < line.size() && line[i] != ' ') throw ParseError("malformed: " + line);
      const std::string rest = i < line.size() ? line.substr(i + 1) : "";
      if (kw == "TYPE") {
        if (out.types.count(name)) throw ParseError("second TYPE for " + name);
        if (finished.count(name) || current == name)
          throw ParseError("TYPE after samples of " + name);
        static const std::set<std::string> kTypes{"counter", "gauge", "histogram", "summary",
                                                  "untyped"};
        if (!kTypes.count(rest)) throw ParseError("unknown type: " + line);
        out.types[name] = rest;
      } else {
        if (out.helps.count(name)) throw ParseError("second HELP for " + name);
        for (size_t k = 0; k < rest.size(); ++k)
          if (rest[k] == '\\' &&
              (k + 1 >= rest.size() || (rest[k + 1] != '\\' && rest[k + 1] != 'n')))
            throw ParseError("bad escape in HELP: " + line);
          else if (rest[k] == '\\')
            ++k;
        out.helps[name] = rest;
      }
      continue;
    }
    size_t i = 0;
    Sample s;
    s.name = read_name(line, i, true);
    std::string key_labels;
    if (i < line.size() && line[i] == '{') {
      ++i;
      while (true) {
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        const std::string lname = read_name(line, i, false);
        if (lname.rfind("__", 0) == 0) throw ParseError("reserved label name: " + line);
        if (i >= line.size() || line[i] != '=') throw ParseError("expected '=': " + line);
        ++i;
        if (i >= line.size() || line[i] != '"') throw ParseError("expected '\"': " + line);
        ++i;
        std::string value;
        while (true) {
          if (i >= line.size()) throw ParseError("unterminated label value: " + line);
          const char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) throw ParseError("dangling escape: " + line);
            const char e = line[i++];
            if (e == '\\')
              value += '\\';
            else if (e == '"')
              value += '"';
            else if (e == 'n')
              value += '\n';
            else
              throw ParseError("bad escape in label value: " + line);
          } else {
            value += c;
          }
        }
        if (!s.labels.emplace(lname, value).second) throw ParseError("repeated label: " + line);
        if (i < line.size() && line[i] == ',') {
          ++i;
          continue;
        }
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        throw ParseError("expected ',' or '}': " + line);
      }
    }
    if (i >= line.size() || line[i] != ' ') throw ParseError("expected a space: " + line);
    ++i;
    std::string rest = line.substr(i);
    std::string value_str = rest, ts;
    if (auto sp = rest.find(' '); sp != std::string::npos) {
      value_str = rest.substr(0, sp);
      ts = rest.substr(sp + 1);
      if (ts.empty() || ts.find_first_not_of("-0123456789") != std::string::npos)
        throw ParseError("bad timestamp: " + line);
    }
    s.value = parse_value(value_str, line);
    const std::string fam = family_of(s.name, out.types);
    if (fam != current) {
      if (!current.empty()) finished.insert(current);
      if (finished.count(fam)) throw ParseError("samples of " + fam + " are not contiguous");
      current = fam;
    }
    auto type = out.types.find(fam);
    if (type != out.types.end() && type->second == "counter" && s.value < 0)
      throw ParseError("negative counter: " + line);
    std::string key = s.name;
    for (const auto& [k, v] : s.labels) key += "|" + k + "=" + v;
    if (!series.insert(key).second) throw ParseError("duplicate series: " + line);
    out.samples.push_back(std::move(s));
  }
  // Histogram invariants.
  for (const auto& [fam, type] : out.types) {
    if (type != "histogram") continue;
    std::map<std::string, std::vector<std::pair<double, double>>> buckets;  // by other labels
    for (const auto& s : out.samples) {
      if (s.name != fam + "_bucket") continue;
      auto le = s.labels.find("le");
      if (le == s.labels.end()) throw ParseError(fam + "_bucket without le");
      std::string key;
      for (const auto& [k, v] : s.labels)
        if (k != "le") key += k + "=" + v + ",";
      buckets[key].emplace_back(parse_value(le->second, fam), s.value);
    }
    for (auto& [key, bs] : buckets) {
      for (size_t k = 1; k < bs.size(); ++k) {
        if (!(bs[k].first > bs[k - 1].first)) throw ParseError(fam + ": le not increasing");
        if (bs[k].second < bs[k - 1].second) throw ParseError(fam + ": buckets not cumulative");
      }
      if (bs.empty() || !std::isinf(bs.back().first)) throw ParseError(fam + ": no +Inf bucket");
      double count = -1;
      bool has_sum = false;
      for (const auto& s : out.samples) {
        std::string k2;
        for (const auto& [k, v] : s.labels) k2 += k + "=" + v + ",";
        if (k2 != key) continue;
        if (s.name == fam + "_count") count = s.value;
        if (s.name == fam + "_sum") has_sum = true;
      }
      if (count != bs.back().second) throw ParseError(fam + ": +Inf bucket != _count");
      if (!has_sum) throw ParseError(fam + ": no _sum");
    }
  }
  return out;
}

}  // namespace meshtrain::obs::testing
