// How the benchmarks run their peers (the PyTorch scripts) and read what they print.
#pragma once

#include <array>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <system_error>

#include <nlohmann/json.hpp>

namespace meshtrain::bench {

struct CommandOutput {
  bool started = false;
  int status = -1;   // pclose's status: 0 when the command succeeded
  std::string text;  // everything it printed on stdout (and stderr where the command says 2>&1)
};

// Runs `cmd` through the shell and waits for it.
inline CommandOutput run_command(const std::string& cmd) {
  CommandOutput out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  out.started = true;
  std::array<char, 4096> buf{};
  while (fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) out.text += buf.data();
  out.status = pclose(p);
  return out;
}

// The last line of `text` that parses as a JSON object, or null.
inline nlohmann::json last_json_line(const std::string& text) {
  std::istringstream lines(text);
  std::string line, last;
  while (std::getline(lines, line))
    if (!line.empty() && line[0] == '{') last = line;
  if (last.empty()) return nullptr;
  nlohmann::json j = nlohmann::json::parse(last, nullptr, false);
  return j.is_object() ? j : nlohmann::json(nullptr);
}

// A file of the source tree (`rel`, e.g. bench/python/x.py) where a program finds it: beside the
// binary first (a shipped pack keeps bin/, bench/python/ and tests/python/ side by side, and a
// build folder sits in the source tree), then in the source tree it was built from.
inline std::string source_file(const std::filesystem::path& rel, const std::string& source_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const fs::path beside = exe.parent_path().parent_path() / rel;
    if (fs::exists(beside, ec)) return beside.string();
  }
  return (fs::path(source_dir) / rel).string();
}

}  // namespace meshtrain::bench
