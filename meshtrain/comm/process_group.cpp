// The backend registry and make_process_group. Built-in backends are registered explicitly on
// first use (self-registering statics would be dropped by the static-library linker).
#include "meshtrain/comm/process_group.h"

#include <map>
#include <mutex>

#include "meshtrain/comm/backends.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {
namespace {

struct Registry {
  std::mutex mu;
  std::map<std::string, BackendFactory> factories;
};

Registry& registry() {
  static Registry r;
  return r;
}

void register_builtins_once() {
  static std::once_flag once;
  std::call_once(once, [] { register_builtin_backends(); });
}

}  // namespace

std::string_view algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::automatic:
      return "auto";
    case Algorithm::ring:
      return "ring";
    case Algorithm::halving_doubling:
      return "halving_doubling";
    case Algorithm::tree:
      return "tree";
    case Algorithm::direct:
      return "direct";
  }
  return "?";
}

Algorithm parse_algorithm(std::string_view name) {
  if (name == "auto" || name == "automatic" || name.empty()) return Algorithm::automatic;
  if (name == "ring") return Algorithm::ring;
  if (name == "halving_doubling" || name == "hd" || name == "recursive_doubling") {
    return Algorithm::halving_doubling;
  }
  if (name == "tree" || name == "binomial") return Algorithm::tree;
  if (name == "direct") return Algorithm::direct;
  MT_THROW(ValueError, "unknown collective algorithm '", name,
           "' (expected auto, ring, halving_doubling, tree or direct)");
}

void register_backend(const std::string& name, BackendFactory factory) {
  auto& r = registry();
  std::lock_guard lock(r.mu);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> registered_backends() {
  register_builtins_once();
  auto& r = registry();
  std::lock_guard lock(r.mu);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

ProcessGroupPtr make_process_group(const std::string& backend, std::shared_ptr<Store> store,
                                   int rank, int size, const ProcessGroupOptions& opts) {
  register_builtins_once();
  BackendFactory factory;
  {
    auto& r = registry();
    std::lock_guard lock(r.mu);
    auto it = r.factories.find(backend);
    if (it == r.factories.end()) {
      std::string known;
      for (const auto& [name, f] : r.factories) known += (known.empty() ? "" : ", ") + name;
      MT_THROW(ValueError, "unknown process group backend '", backend, "' (known: ", known, ")");
    }
    factory = it->second;
  }
  return factory(std::move(store), rank, size, opts);
}

}  // namespace meshtrain::comm
