// The checkpoint tools. DIR may be a checkpoint root (the step `latest` names is used, without
// falling back: these commands report on exactly what a restart would try first), a pointer
// file (ROOT/best, ROOT/latest: the step it names) or a step directory. verify exits 0 when
// every file matches the manifest and 1 with one line per bad file otherwise; export writes the
// model's global tensors into one safetensors file that PyTorch (or `meshtrain sample`) reads.
// DIR may also be s3://bucket/prefix[/latest|/best|/step_<N>]: the step is downloaded (every
// object checked against the manifest) under MESHTRAIN_S3_CACHE first.
#include "apps/meshtrain/ckpt_command.h"

#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include "meshtrain/ckpt/checkpoint_dir.h"
#include "meshtrain/ckpt/checkpoint_loader.h"
#include "meshtrain/ckpt/manifest.h"
#include "meshtrain/ckpt/remote_checkpoints.h"
#include "meshtrain/ckpt/safetensors.h"
#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::apps {

namespace {

std::string human_bytes(uint64_t n) {
  std::ostringstream os;
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  os << std::fixed << std::setprecision(u == 0 ? 0 : 1) << v << " " << units[u];
  return os.str();
}

std::string sharding_str(const ckpt::TensorRecord& t) {
  if (t.kind == ckpt::ShardKind::replicated)
    return "replicated (" + std::to_string(t.shards.size()) + " cop" +
           (t.shards.size() == 1 ? "y" : "ies") + ")";
  // "dim1 over 2 shards", "dim0 in 3 blocks over 2 shards", "flat over 4 shards": offsets and
  // lengths in slices of that dimension (of each block) or in elements.
  std::string s = t.kind == ckpt::ShardKind::flat ? "flat" : "dim" + std::to_string(t.dim);
  if (t.kind == ckpt::ShardKind::dim && t.blocks > 1)
    s += " in " + std::to_string(t.blocks) + " blocks";
  s += " over " + std::to_string(t.shards.size()) + " shards [";
  for (size_t i = 0; i < t.shards.size(); ++i) {
    if (i > 0) s += ", ";
    const auto& sh = t.shards[i];
    s += "r" + std::to_string(sh.rank) + ":" + std::to_string(sh.offset) + "+" +
         std::to_string(sh.length);
  }
  return s + "]";
}

// A local checkpoint directory, or an s3:// one downloaded into the cache.
std::string resolve_dir(const std::string& dir) {
  if (!ckpt::is_object_uri(dir)) return ckpt::resolve_checkpoint_dir(dir);
  return ckpt::materialize_remote_checkpoint(dir, ckpt::object_cache_root());
}

int run_inspect(const std::string& dir, bool json) {
  const std::string step_dir = resolve_dir(dir);
  const ckpt::Manifest m = ckpt::read_manifest(step_dir);
  if (json) {
    std::cout << m.to_json().dump(2) << std::endl;
    return 0;
  }
  std::cout << "checkpoint " << step_dir << "\n"
            << "  step " << m.step << ", epoch " << m.epoch << ", written by meshtrain "
            << m.software_version << " (format " << m.format_version << ")\n"
            << "  world: " << m.world.world_size << " ranks (dp " << m.world.dp << ", tp "
            << m.world.tp << ", pp " << m.world.pp << "), ZeRO stage " << m.world.zero_stage
            << "\n";
  size_t width = 4;
  uint64_t tensor_bytes = 0;
  for (const auto& t : m.tensors) {
    width = std::max(width, t.name.size());
    tensor_bytes += static_cast<uint64_t>(shape_numel(t.shape)) * dtype_size(t.dtype);
  }
  std::cout << "  tensors: " << m.tensors.size() << " (" << human_bytes(tensor_bytes)
            << " global)\n";
  for (const auto& t : m.tensors) {
    std::cout << "    " << std::left << std::setw(static_cast<int>(width)) << t.name << "  "
              << std::setw(5) << t.group << "  " << std::setw(4) << dtype_name(t.dtype) << "  "
              << std::setw(14) << shape_str(t.shape) << "  " << sharding_str(t) << "\n";
  }
  uint64_t file_bytes = 0;
  size_t fwidth = 4;
  for (const auto& f : m.files) {
    file_bytes += f.bytes;
    fwidth = std::max(fwidth, f.name.size());
  }
  std::cout << "  files: " << m.files.size() << " (" << human_bytes(file_bytes) << ")\n";
  for (const auto& f : m.files) {
    std::cout << "    " << std::left << std::setw(static_cast<int>(fwidth)) << f.name << "  rank "
              << f.rank << "  " << std::right << std::setw(12) << f.bytes << " bytes  xxh3 "
              << hash_hex(f.xxh3) << std::left << "\n";
  }
  std::cout << "  train state: " << m.train_state.dump() << std::endl;
  return 0;
}

int run_verify(const std::string& dir) {
  std::string step_dir;
  try {
    step_dir = resolve_dir(dir);
  } catch (const ckpt::ObjectStoreError&) {
    throw;
  } catch (const IoError& e) {
    if (!ckpt::is_object_uri(dir)) throw;
    std::cout << "bad: " << e.what() << std::endl;  // a remote object is missing or corrupt
    return 1;
  }
  const std::vector<std::string> problems = ckpt::verify_checkpoint(step_dir);
  if (problems.empty()) {
    const ckpt::Manifest m = ckpt::read_manifest(step_dir);
    std::cout << "ok: " << step_dir << " (step " << m.step << ", " << m.files.size()
              << " files verified)" << std::endl;
    return 0;
  }
  for (const std::string& p : problems) std::cout << "bad: " << step_dir << "/" << p << "\n";
  std::cout.flush();
  return 1;
}

int run_export(const std::string& dir, const std::string& out, const std::string& group) {
  const std::string step_dir = resolve_dir(dir);
  const ckpt::Checkpoint c = ckpt::Checkpoint::open(step_dir);
  ckpt::NamedTensors tensors = c.load_group(group);
  if (tensors.empty())
    MT_THROW(ValueError, "checkpoint ", step_dir, " has no tensors in group '", group, "'");
  ckpt::SafetensorsMetadata meta{{"format", "pt"},
                                 {"meshtrain_step", std::to_string(c.step())},
                                 {"meshtrain_version", c.manifest().software_version}};
  // A trainer that stores its config in the train state makes the export usable by `sample`.
  if (auto it = c.train_state().find("meshtrain_config"); it != c.train_state().end())
    meta["meshtrain_config"] = it->is_string() ? it->get<std::string>() : it->dump();
  const ckpt::FileDigest d = ckpt::save_safetensors(out, tensors, meta);
  std::cout << "exported " << tensors.size() << " tensors of group '" << group << "' from step "
            << c.step() << " to " << out << " (" << human_bytes(d.bytes) << ")" << std::endl;
  return 0;
}

}  // namespace

std::function<int()> add_ckpt_command(CLI::App& app) {
  struct Args {
    std::string dir, out, group = "model";
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  auto* ckpt_cmd = app.add_subcommand("ckpt", "inspect, verify and export checkpoints");
  ckpt_cmd->require_subcommand(1);
  auto* inspect = ckpt_cmd->add_subcommand("inspect", "print a checkpoint's manifest");
  inspect
      ->add_option("dir", args->dir,
                   "checkpoint root (uses latest), step directory, pointer file (ROOT/best), or "
                   "s3://bucket/prefix[/best|/step_N]")
      ->required();
  inspect->add_flag("--json", args->json, "print the manifest as JSON");
  auto* verify = ckpt_cmd->add_subcommand("verify", "check every file's size and xxh3");
  verify
      ->add_option("dir", args->dir,
                   "checkpoint root (uses latest), step directory, pointer file (ROOT/best), or "
                   "s3://bucket/prefix[/best|/step_N]")
      ->required();
  auto* exp = ckpt_cmd->add_subcommand(
      "export", "write one tensor group's global tensors to a single safetensors file");
  exp->add_option("dir", args->dir,
                  "checkpoint root (uses latest), step directory, pointer file (ROOT/best), or "
                  "s3://bucket/prefix[/best|/step_N]")
      ->required();
  exp->add_option("--out", args->out, "output .safetensors file")->required();
  exp->add_option("--group", args->group, "tensor group to export");
  return [=]() -> int {
    if (inspect->parsed()) return run_inspect(args->dir, args->json);
    if (verify->parsed()) return run_verify(args->dir);
    if (exp->parsed()) return run_export(args->dir, args->out, args->group);
    return 2;
  };
}

}  // namespace meshtrain::apps
