// Runs the torch.optim reference script (tests/python/optim_reference.py) with the system
// Python and parses its JSON answer. Tests skip when that Python cannot import torch.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

namespace meshtrain::optim::testing {

// Debian's python3-torch is installed for the system interpreter, not whatever python is on PATH.
inline constexpr const char* kSystemPython = "/usr/bin/python3";

inline std::string python_command() {
  return std::string("env -u PYTHONPATH -u PYTHONHOME ") + kSystemPython;
}

inline bool torch_available() {
  static const bool ok = [] {
    const std::string cmd = python_command() + " -c 'import torch' >/dev/null 2>&1";
    return std::system(cmd.c_str()) == 0;
  }();
  return ok;
}

// Writes `spec` to a temporary file, runs the reference on it and returns the parsed output.
// Throws std::runtime_error with the script's stderr when it fails.
inline nlohmann::json run_torch_reference(const nlohmann::json& spec) {
  namespace fs = std::filesystem;
  static int counter = 0;
  const fs::path dir = fs::temp_directory_path();
  const std::string stem =
      "meshtrain_optim_ref_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
  const fs::path spec_path = dir / (stem + ".json");
  const fs::path err_path = dir / (stem + ".err");
  {
    std::ofstream out(spec_path);
    out << spec.dump();
  }
  const std::string script = std::string(MESHTRAIN_SOURCE_DIR) + "/tests/python/optim_reference.py";
  const std::string cmd = python_command() + " '" + script + "' '" + spec_path.string() + "' 2>'" +
                          err_path.string() + "'";
  std::string output;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed for: " + cmd);
  std::array<char, 65536> buf{};
  size_t n;
  while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0) output.append(buf.data(), n);
  const int status = ::pclose(pipe);
  std::string err;
  {
    std::ifstream in(err_path);
    err.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  fs::remove(spec_path);
  fs::remove(err_path);
  if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    throw std::runtime_error("reference script failed: " + err);
  }
  return nlohmann::json::parse(output);
}

}  // namespace meshtrain::optim::testing
