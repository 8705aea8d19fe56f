// Preset figures are the vendors' peak numbers and the bus bandwidths that NCCL's all-reduce
// tests reach on such machines; `efficiency` is the fraction of peak that large training GEMMs
// sustain there. Calibration replaces all of them with what this machine measures.
// gemm_half_dim 128 on the GPUs is the tile size of their tensor-core GEMM kernels (a product
// with a dimension of 128 runs at about half the rate of a large one); it is assumed, not
// measured, and the efficiencies are the large-product rates that go with it and with the
// element-wise bandwidth: one set of constants for every row of the Megatron-LM table
// (tests/plan/megatron_table_test.cpp; A100 0.78, the H100's scaled from its earlier 0.62 by
// the same 0.78 / 0.68 the A100's rose when the element-wise work entered the model).
// elementwise_gbps on the GPUs is 80% of the HBM's peak (H100 SXM 3.35 TB/s, A100 80 GB
// 2.04 TB/s), what streaming kernels (LayerNorm, GELU, the fused optimizer) sustain there; it is
// assumed, not measured, and it counts meshtrain's own unfused passes (time_model.h), which
// overstate what fused GPU kernels move, so it errs towards slower.
#include "meshtrain/plan/cluster.h"

#include <toml++/toml.h>
#include <filesystem>
#include <sstream>

#include "meshtrain/plan/memory_model.h"
#include "meshtrain/util/error.h"

namespace meshtrain::plan {

std::vector<std::string> cluster_preset_names() {
  return {"h100-nvlink-ib", "a100-nvlink-ib", "cpu-host"};
}

ClusterSpec cluster_preset(const std::string& name) {
  ClusterSpec c;
  c.name = name;
  if (name == "h100-nvlink-ib") {
    c.nodes = 1;
    c.devices_per_node = 8;
    c.device_memory = 80e9;
    c.peak_flops = 989e12;  // dense bf16
    c.efficiency = 0.71;
    c.gemm_half_dim = 128;
    c.elementwise_bandwidth = 0.8 * 3.35e12;  // HBM3
    c.intra = {360e9, 3e-6};                  // NVLink 4 via NVSwitch
    c.inter = {45e9, 8e-6};                   // one 400 Gb/s NDR port per GPU
    c.device = "cuda";
    c.precision = "mixed";
    return c;
  }
  if (name == "a100-nvlink-ib") {
    c.nodes = 1;
    c.devices_per_node = 8;
    c.device_memory = 80e9;
    c.peak_flops = 312e12;  // dense bf16/f16
    c.efficiency = 0.78;
    c.gemm_half_dim = 128;
    c.elementwise_bandwidth = 0.8 * 2.04e12;  // HBM2e
    c.intra = {230e9, 3e-6};                  // NVLink 3 via NVSwitch
    c.inter = {22e9, 8e-6};                   // one 200 Gb/s HDR port per GPU
    c.device = "cuda";
    c.precision = "mixed";
    return c;
  }
  if (name == "cpu-host") {
    // Round numbers for a small x86 server; `meshtrain plan --calibrate` measures them.
    c.nodes = 1;
    c.devices_per_node = 2;
    c.device_memory = 4e9;
    c.peak_flops = 50e9;
    c.efficiency = 1.0;
    c.elementwise_bandwidth = 5e9;  // one core's streaming rate, roughly
    c.intra = {4e9, 10e-6};         // shared memory
    c.inter = {1e9, 50e-6};         // TCP over 10 GbE
    // What calibrate() measured on such a host in a build that links the CUDA libraries: 160 MiB
    // of code and libraries (most of it the CUDA libraries' relocated code) and 48 MiB of a
    // training rank's runtime (see calibrate.cpp).
    c.process_memory = 208.0 * 1048576.0;
    return c;
  }
  std::string names;
  for (const auto& n : cluster_preset_names()) names += (names.empty() ? "" : ", ") + n;
  MT_THROW(ValueError, "unknown cluster preset \"", name, "\"; known: ", names,
           " (or a TOML file with a [cluster] table)");
}

ClusterSpec load_cluster(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    MT_THROW(IoError, "cluster file ", path, " does not exist or is not a regular file");
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    MT_THROW(ValueError, "cluster file ", path, ":", e.source().begin.line, ": ", e.description());
  }
  const toml::table* t = root["cluster"].as_table();
  if (t == nullptr) MT_THROW(ValueError, "cluster file ", path, ": no [cluster] table");
  ClusterSpec c;
  if (auto preset = (*t)["preset"].value<std::string>()) c = cluster_preset(*preset);
  auto num = [&](const char* key, double& out, double scale) {
    const toml::node* n = t->get(key);
    if (n == nullptr) return;
    auto v = n->value<double>();
    if (!v || *v <= 0)
      MT_THROW(ValueError, "cluster file ", path, ": cluster.", key, " must be a positive number");
    out = *v * scale;
  };
  auto integer = [&](const char* key, int64_t& out) {
    const toml::node* n = t->get(key);
    if (n == nullptr) return;
    auto v = n->value<int64_t>();
    if (!v || *v <= 0)
      MT_THROW(ValueError, "cluster file ", path, ": cluster.", key, " must be a positive integer");
    out = *v;
  };
  for (const auto& [key, value] : *t) {
    static const char* known[] = {
        "preset",           "name",       "nodes",      "devices_per_node",  "device_memory_gb",
        "peak_tflops",      "efficiency", "intra_gbps", "intra_latency_us",  "inter_gbps",
        "inter_latency_us", "device",     "precision",  "process_memory_mb", "gemm_half_dim",
        "elementwise_gbps"};
    bool ok = false;
    for (const char* k : known) ok = ok || key.str() == k;
    if (!ok) MT_THROW(ValueError, "cluster file ", path, ": unknown key cluster.", key.str());
    (void)value;
  }
  if (auto v = (*t)["name"].value<std::string>()) c.name = *v;
  integer("nodes", c.nodes);
  integer("devices_per_node", c.devices_per_node);
  num("device_memory_gb", c.device_memory, 1e9);
  num("peak_tflops", c.peak_flops, 1e12);
  num("efficiency", c.efficiency, 1.0);
  if (const toml::node* n = t->get("gemm_half_dim")) {
    auto v = n->value<double>();
    if (!v || *v < 0)
      MT_THROW(ValueError, "cluster file ", path,
               ": cluster.gemm_half_dim must be a number >= 0 (0: GEMM rate independent of shape)");
    c.gemm_half_dim = *v;
  }
  if (const toml::node* n = t->get("elementwise_gbps")) {
    auto v = n->value<double>();
    if (!v || *v < 0)
      MT_THROW(ValueError, "cluster file ", path,
               ": cluster.elementwise_gbps must be a number >= 0 (0: element-wise work not "
               "modelled)");
    c.elementwise_bandwidth = *v * 1e9;
  }
  if (const toml::node* n = t->get("process_memory_mb")) {
    auto v = n->value<double>();
    if (!v || *v < 0)
      MT_THROW(ValueError, "cluster file ", path,
               ": cluster.process_memory_mb must be a number >= 0 (MiB per rank)");
    c.process_memory = *v * 1048576.0;
  }
  num("intra_gbps", c.intra.bandwidth, 1e9);
  num("intra_latency_us", c.intra.latency, 1e-6);
  num("inter_gbps", c.inter.bandwidth, 1e9);
  num("inter_latency_us", c.inter.latency, 1e-6);
  if (auto v = (*t)["device"].value<std::string>()) c.device = *v;
  if (auto v = (*t)["precision"].value<std::string>()) c.precision = *v;
  if (c.efficiency > 1.0)
    MT_THROW(ValueError, "cluster file ", path, ": cluster.efficiency must be at most 1");
  (void)parse_precision(c.precision);
  return c;
}

std::string cluster_to_toml(const ClusterSpec& c) {
  std::ostringstream os;
  os.precision(6);
  os << "[cluster]\n"
     << "name = \"" << c.name << "\"\n"
     << "nodes = " << c.nodes << "\n"
     << "devices_per_node = " << c.devices_per_node << "\n"
     << "device_memory_gb = " << c.device_memory / 1e9 << "\n"
     << "process_memory_mb = " << c.process_memory / 1048576.0 << "\n"
     << "peak_tflops = " << c.peak_flops / 1e12 << "\n"
     << "efficiency = " << c.efficiency << "\n"
     << "gemm_half_dim = " << c.gemm_half_dim << "\n"
     << "elementwise_gbps = " << c.elementwise_bandwidth / 1e9 << "\n"
     << "intra_gbps = " << c.intra.bandwidth / 1e9 << "\n"
     << "intra_latency_us = " << c.intra.latency / 1e-6 << "\n"
     << "inter_gbps = " << c.inter.bandwidth / 1e9 << "\n"
     << "inter_latency_us = " << c.inter.latency / 1e-6 << "\n"
     << "device = \"" << c.device << "\"\n"
     << "precision = \"" << c.precision << "\"\n";
  return os.str();
}

}  // namespace meshtrain::plan
