// `meshtrain tls gen-ca` and `meshtrain tls gen-cert`: a development CA and per-node
// certificates for dist.tls (meshtrain/comm/tls.h), made with OpenSSL's C API.
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace meshtrain::apps {

// Adds the subcommand to `app`; after parsing, the returned function runs it if it was chosen
// and returns the exit status, or returns -1 when it was not chosen.
std::function<int()> add_tls_command(CLI::App& app);

}  // namespace meshtrain::apps
