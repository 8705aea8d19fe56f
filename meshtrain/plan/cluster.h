// What the planner knows about the hardware: nodes of identical devices, their memory and speed,
// and two links (inside a node, between nodes), each a bandwidth and a latency. Presets for
// common machines, a TOML form for the rest, and this machine measured by calibrate().
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

namespace meshtrain::plan {

struct Link {
  double bandwidth = 1e9;  // bytes/s one rank can send while all send (bus bandwidth)
  double latency = 1e-5;   // seconds per message step
};

struct ClusterSpec {
  std::string name = "custom";
  int64_t nodes = 1;
  int64_t devices_per_node = 1;
  double device_memory = 16e9;  // bytes usable per device
  double peak_flops = 1e12;     // per device, at the training precision
  double efficiency = 0.5;      // achieved fraction of peak for large GEMMs
  // How a GEMM's rate falls with its shape: an m x n x k product runs at
  // peak * efficiency * s(m) s(n) s(k), s(d) = d / (d + gemm_half_dim); 0 = shape-blind. The
  // factor is symmetric, so forward and both backward products of a layer share it.
  double gemm_half_dim = 0;
  // Bytes of device memory each rank's process holds besides its training state: on a CPU
  // cluster the process's code, libraries and runtime (measured by calibrate()), on a GPU the
  // framework's context (0 in the GPU presets: not measured).
  double process_memory = 0;
  // Bytes per second one rank's element-wise kernels (LayerNorm, GELU, softmax, residual adds,
  // the optimizer update) move while every rank runs them, counted as the time model counts
  // them (time_model.h: each input read and each output written once); 0 = not modelled.
  double elementwise_bandwidth = 0;
  Link intra;                     // NVLink, shared memory
  Link inter;                     // InfiniBand, Ethernet
  std::string device = "cpu";     // train.device for the config the planner writes
  std::string precision = "f32";  // f32 or mixed (see memory_model.h)

  int64_t world() const { return nodes * devices_per_node; }
};

// "h100-nvlink-ib" (8 x H100 80 GB, NVLink 4 + 400 Gb/s InfiniBand per GPU), "a100-nvlink-ib"
// (8 x A100 80 GB, Selene-like: NVLink 3 + 8 x 200 Gb/s HDR), "cpu-host" (this kind of
// machine: ranks as processes, shared memory between them, TCP between hosts). ValueError
// listing the names for any other.
ClusterSpec cluster_preset(const std::string& name);
std::vector<std::string> cluster_preset_names();

// A TOML file: [cluster] name, nodes, devices_per_node, device_memory_gb, process_memory_mb,
// peak_tflops, efficiency, gemm_half_dim, elementwise_gbps, intra_gbps, intra_latency_us,
// inter_gbps, inter_latency_us, device, precision (GB/s of bytes, not bits). An optional `preset`
// key is applied first. ValueError naming the key.
ClusterSpec load_cluster(const std::string& path);
std::string cluster_to_toml(const ClusterSpec& c);

// Measures this machine: f32 GEMM FLOP/s of one rank with `threads` OpenMP threads (0 = all
// cores divided by `ranks`) while `ranks` ranks multiply at once, and how it falls for a thin
// product (gemm_half_dim); the bytes per second of the project's LayerNorm, GELU and AdamW
// kernels on training-sized arrays at one thread and at `threads` (elementwise_bandwidth: the
// latter); shm and tcp all-reduce bandwidth and latency with `ranks` ranks in
// this process; the memory this process holds before it allocates anything (a training rank
// runs the same program with the same libraries); and the free memory. Progress lines go to
// `log` when given.
ClusterSpec calibrate(int64_t ranks, int64_t threads, std::ostream* log);

}  // namespace meshtrain::plan
