// Skips for a missing capability (a program, a Python module, root, a kind of namespace, a
// device), all through one macro, so that a run which must have a capability can say so:
//
//   MESHTRAIN_TEST_REQUIRE=netns,torch,prometheus ctest ...
//
// turns the skip of each named capability into a failure that gives the same reason. CI sets it
// for everything scripts/install-deps.sh installs, so losing a package (or root) fails the run
// instead of quietly skipping the tests that need it. A name no test knows is a failure too: a
// typo must not switch the check off.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/util/env_registry.h"

namespace meshtrain::testing {

inline const std::string_view kRequireVariable = meshtrain::env_name(meshtrain::Env::test_require);

// Every capability a test may skip for; tests/README.md says what each one means.
inline constexpr std::array<std::string_view, 18> kCapabilities = {
    "netns",          // network namespaces and veth links (root, iproute2)
    "mountns",        // a private mount namespace with a small /dev/shm (root)
    "cgroup",         // a cgroup v2 memory controller this process may create groups in (root)
    "python",         // /usr/bin/python3
    "torch",          // /usr/bin/python3 with torch (python3-torch)
    "prometheus",     // prometheus and promtool (prometheus)
    "chromium",       // headless chromium (chromium)
    "etcd",           // etcd (etcd-server); its harness fails rather than skips without it
    "slurm",          // a one-node Slurm cluster (slurmctld, slurmd, munge; root)
    "mpirun",         // Open MPI's mpirun (openmpi-bin)
    "kubectl",        // kubectl with kustomize (kubernetes-client)
    "npm",            // the manifest validator's npm packages (nodejs, npm)
    "s3rver",         // npm's s3rver under tests/s3server, the S3 server of the s3:// tests
    "fashion-mnist",  // the Fashion-MNIST IDX files (dataset-fashion-mnist)
    "ipv6",           // an IPv6 loopback address
    "cores",          // at least two usable cores
    "cuda",           // one CUDA device (and a CUDA build)
    "cuda-2",         // two CUDA devices
};

// The names in a MESHTRAIN_TEST_REQUIRE value: comma-separated, blanks around names ignored.
inline std::vector<std::string> parse_required(std::string_view value) {
  std::vector<std::string> names;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view name = value.substr(start, end - start);
    while (!name.empty() && (name.front() == ' ' || name.front() == '\t')) name.remove_prefix(1);
    while (!name.empty() && (name.back() == ' ' || name.back() == '\t')) name.remove_suffix(1);
    if (!name.empty()) names.emplace_back(name);
    start = end + 1;
  }
  return names;
}

constexpr bool is_known_capability(std::string_view name) {
  return std::find(kCapabilities.begin(), kCapabilities.end(), name) != kCapabilities.end();
}

inline std::string known_capabilities() {
  std::string all;
  for (std::string_view n : kCapabilities) {
    if (!all.empty()) all += ", ";
    all += n;
  }
  return all;
}

// The names in `value` that are not capabilities, joined with ", " (empty when all are known).
inline std::string unknown_capabilities(std::string_view value) {
  std::string unknown;
  for (const std::string& n : parse_required(value)) {
    if (is_known_capability(n)) continue;
    if (!unknown.empty()) unknown += ", ";
    unknown += n;
  }
  return unknown;
}

inline std::string required_value() {
  return meshtrain::env_value(meshtrain::Env::test_require).value_or("");
}

// Whether `value` names `capability`.
inline bool requires_capability(std::string_view value, std::string_view capability) {
  const std::vector<std::string> names = parse_required(value);
  return std::find(names.begin(), names.end(), capability) != names.end();
}

}  // namespace meshtrain::testing

// Skips the current test with `reason` (anything that streams into GTEST_SKIP()) unless
// `condition` holds; fails instead when MESHTRAIN_TEST_REQUIRE names `capability`. Returns from
// the enclosing void function either way, as GTEST_SKIP() does.
#define MT_SKIP_UNLESS(capability, condition, reason)                                           \
  do {                                                                                          \
    static_assert(::meshtrain::testing::is_known_capability(capability),                        \
                  "MT_SKIP_UNLESS: add the capability to kCapabilities first");                 \
    if (!(condition)) {                                                                         \
      const std::string mt_required_ = ::meshtrain::testing::required_value();                  \
      const std::string mt_unknown_ = ::meshtrain::testing::unknown_capabilities(mt_required_); \
      if (!mt_unknown_.empty())                                                                 \
        GTEST_FAIL() << "MESHTRAIN_TEST_REQUIRE names unknown capabilities: " << mt_unknown_;   \
      if (::meshtrain::testing::requires_capability(mt_required_, capability))                  \
        GTEST_FAIL() << "capability '" << (capability)                                          \
                     << "' is required (MESHTRAIN_TEST_REQUIRE) but missing: " << reason;       \
      GTEST_SKIP() << reason;                                                                   \
    }                                                                                           \
  } while (0)
