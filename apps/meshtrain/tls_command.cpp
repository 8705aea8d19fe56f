// See tls_command.h.
#include "apps/meshtrain/tls_command.h"

#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "meshtrain/comm/tls.h"

namespace meshtrain::apps {

std::function<int()> add_tls_command(CLI::App& app) {
  struct Args {
    std::string out = ".";
    std::string name;
    std::string ca_cert, ca_key;
    std::vector<std::string> hosts;
    double days = 365;
    double valid_from_days = 0;
  };
  auto a = std::make_shared<Args>();
  auto* tls = app.add_subcommand("tls", "certificates for dist.tls (development CA, node certs)");
  tls->require_subcommand(1);
  auto* gen_ca = tls->add_subcommand("gen-ca", "make a CA: OUT/ca.pem and OUT/ca.key");
  gen_ca->add_option("--out", a->out, "output directory (default: .)");
  gen_ca->add_option("--days", a->days, "validity in days (default 365)");
  gen_ca->add_option("--name", a->name, "the CA's common name");
  auto* gen_cert = tls->add_subcommand(
      "gen-cert", "make a node certificate signed by the CA: OUT/NAME.pem and OUT/NAME.key");
  gen_cert->add_option("--ca", a->ca_cert, "the CA certificate (ca.pem)")->required();
  gen_cert->add_option("--ca-key", a->ca_key, "the CA's key (default: --ca with .key)");
  gen_cert
      ->add_option("--host", a->hosts,
                   "host name or IP address (repeatable; the first "
                   "names the files)")
      ->required();
  gen_cert->add_option("--name", a->name, "file name stem and common name (default: first host)");
  gen_cert->add_option("--out", a->out, "output directory (default: .)");
  gen_cert->add_option("--days", a->days,
                       "validity in days from the start (default 365; tests: negative)");
  gen_cert->add_option("--valid-from-days", a->valid_from_days,
                       "start of validity relative to now, days (default 0, i.e. an hour ago)");
  return [a, gen_ca, gen_cert]() -> int {
    if (!gen_ca->parsed() && !gen_cert->parsed()) return -1;
    std::filesystem::create_directories(a->out);
    comm::CertOptions o;
    o.common_name = a->name;
    const int64_t start = static_cast<int64_t>(a->valid_from_days * 86400);
    o.not_before_s = start - 3600;
    o.not_after_s = start + static_cast<int64_t>(a->days * 86400);
    if (gen_ca->parsed()) {
      const std::string cert = a->out + "/ca.pem", key = a->out + "/ca.key";
      comm::generate_ca(cert, key, o);
      std::cout << "wrote " << cert << " and " << key << std::endl;
      return 0;
    }
    std::string ca_key = a->ca_key;
    if (ca_key.empty()) {
      ca_key = a->ca_cert;
      if (auto dot = ca_key.rfind('.'); dot != std::string::npos) ca_key.erase(dot);
      ca_key += ".key";
    }
    o.hosts = a->hosts;
    const std::string stem = a->name.empty() ? a->hosts.front() : a->name;
    const std::string cert = a->out + "/" + stem + ".pem", key = a->out + "/" + stem + ".key";
    comm::generate_cert(a->ca_cert, ca_key, cert, key, o);
    std::cout << "wrote " << cert << " and " << key << std::endl;
    return 0;
  };
}

}  // namespace meshtrain::apps
