// See tls_config.h.
#include "meshtrain/runtime/tls_config.h"

#include "meshtrain/util/log.h"

namespace meshtrain::runtime {

comm::TlsSettings tls_settings(const TrainConfig& config) {
  comm::TlsSettings s = comm::TlsSettings::from_env();
  if (config.dist.tls) {
    s.enabled = true;
    s.enabled_from = "dist.tls";
  }
  auto pick = [](const std::string& value, const char* key, std::string& path, std::string& from) {
    if (value.empty()) return;
    path = value;
    from = key;
  };
  pick(config.dist.tls_cert, "dist.tls_cert", s.cert, s.cert_from);
  pick(config.dist.tls_key, "dist.tls_key", s.key, s.key_from);
  pick(config.dist.tls_ca, "dist.tls_ca", s.ca, s.ca_from);
  return s;
}

std::shared_ptr<const comm::TlsContext> tls_from_config(const TrainConfig& config) {
  const comm::TlsSettings s = tls_settings(config);
  if (!s.enabled) return nullptr;
  auto tls = comm::TlsContext::load(s);
  MT_LOG_INFO("tls", "TLS 1.3 on the store, the tcp collectives and the metrics endpoint as ",
              tls->subject(), " (CA ", s.ca, ")");
  return tls;
}

}  // namespace meshtrain::runtime
