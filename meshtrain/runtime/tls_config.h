// The worker's TLS settings: a training config's dist.tls, dist.tls_cert, dist.tls_key and
// dist.tls_ca, each falling back to its MESHTRAIN_TLS* variable (which meshrun --tls-* sets), so
// that the same files serve the store meshrun hosts and the collectives.
#pragma once

#include <memory>

#include "meshtrain/comm/tls.h"
#include "meshtrain/runtime/config.h"

namespace meshtrain::runtime {

// The settings: TLS is on when dist.tls is true or MESHTRAIN_TLS is; a path set in the config
// wins over the variable. Each value names where it came from for error messages.
comm::TlsSettings tls_settings(const TrainConfig& config);
// The loaded context, null when TLS is off. ValueError (exit 2) naming the key and the file when
// a file is missing or unreadable.
std::shared_ptr<const comm::TlsContext> tls_from_config(const TrainConfig& config);

}  // namespace meshtrain::runtime
