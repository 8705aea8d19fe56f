// The command-line options of a benchmark's PyTorch side, and where it finds an interpreter
// with torch: shared by the GPU benchmarks, which run on hosts set up in many ways.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>

namespace meshtrain::bench {

struct TorchPeer {
  std::string python = "python3";
  std::string script;  // the PyTorch side's script
  int timeout_s = 600;
  bool skip = false;

  // --python, --torch-script, --torch-timeout (`timeout_what`: per run, or for the whole side)
  // and --no-torch.
  void add_options(CLI::App& app, const char* timeout_what) {
    app.add_option("--python", python, "Python interpreter with torch");
    app.add_option("--torch-script", script,
                   "PyTorch side (default: ../bench/python/ beside the binary, else the source "
                   "tree's)");
    app.add_option("--torch-timeout", timeout_s, std::string("seconds allowed ") + timeout_what);
    app.add_flag("--no-torch", skip, "skip the PyTorch side");
  }

  // run(interpreter) once with `python`; where that is the default "python3" and the result
  // says torch is not importable there (`torch_missing(result)`), once more with the system's
  // /usr/bin/python3: the default may be a virtual environment without torch while the system
  // has Debian's python3-torch.
  template <typename Run, typename TorchMissing>
  auto run(Run&& run_with, TorchMissing&& torch_missing) const {
    auto out = run_with(python);
    if (python == "python3" && torch_missing(out)) return run_with(std::string("/usr/bin/python3"));
    return out;
  }
};

}  // namespace meshtrain::bench
