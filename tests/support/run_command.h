// Runs a shell command for end-to-end tests of the built programs and captures what it printed
// (stdout and stderr together) and its exit status (128 + signal when killed).
#pragma once

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace meshtrain::testing {

struct CommandResult {
  int status = -1;
  std::string output;
};

inline CommandResult run_command(const std::string& cmd) {
  CommandResult r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf{};
  while (std::fgets(buf.data(), static_cast<int>(buf.size()), p) != nullptr) r.output += buf.data();
  const int st = ::pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return r;
}

}  // namespace meshtrain::testing
