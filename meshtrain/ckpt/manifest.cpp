// Manifest (de)serialisation and validation. Everything read from the file is checked before
// use: a loader must be able to trust a manifest that parsed, or get one clear IoError.
#include "meshtrain/ckpt/manifest.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "meshtrain/util/error.h"
#include "meshtrain/util/hash.h"

namespace meshtrain::ckpt {

namespace {

using OJson = nlohmann::ordered_json;
using Json = nlohmann::json;

constexpr const char* kFormatName = "meshtrain-checkpoint";
constexpr uint64_t kMaxManifestBytes = uint64_t{256} << 20;

[[noreturn]] void bad(const std::string& where, const std::string& what) {
  MT_THROW(IoError, "checkpoint manifest ", where, ": ", what);
}

uint64_t parse_hex(const std::string& s, const std::string& where) {
  if (s.size() != 16 || s.find_first_not_of("0123456789abcdef") != std::string::npos)
    bad(where, "'" + s + "' is not a 16-digit hex checksum");
  return std::stoull(s, nullptr, 16);
}

bool safe_file_name(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

int64_t get_int(const Json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j.at(key).is_number_integer())
    bad(where, std::string("\"") + key + "\" is missing or not an integer");
  return j.at(key).get<int64_t>();
}

int64_t get_nonneg(const Json& j, const char* key, const std::string& where) {
  const int64_t v = get_int(j, key, where);
  if (v < 0) bad(where, std::string("\"") + key + "\" is negative");
  return v;
}

std::string get_str(const Json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j.at(key).is_string())
    bad(where, std::string("\"") + key + "\" is missing or not a string");
  return j.at(key).get<std::string>();
}

const Json& get_array(const Json& j, const char* key, const std::string& where) {
  if (!j.contains(key) || !j.at(key).is_array())
    bad(where, std::string("\"") + key + "\" is missing or not an array");
  return j.at(key);
}

ShardRecord parse_shard(const Json& s, const std::string& where) {
  if (!s.is_object()) bad(where, "a shard entry is not an object");
  ShardRecord r;
  r.rank = get_nonneg(s, "rank", where);
  r.file = get_str(s, "file", where);
  if (s.contains("offset")) r.offset = get_nonneg(s, "offset", where);
  if (s.contains("length")) r.length = get_nonneg(s, "length", where);
  return r;
}

// Sorts the pieces of a dim or flat tensor and checks that they tile [0, shape[dim] / blocks) or
// [0, numel): identical ranges are copies and empty pieces cover nothing, anything else that
// leaves a gap or overlaps is refused, naming the first place where it happens.
void check_tiling(TensorRecord& t, const std::string& where) {
  const bool flat = t.kind == ShardKind::flat;
  const std::string what = "tensor '" + t.name + "'";
  // Along a dimension other than the first (or in blocks), a unit is one slice of that dimension.
  const std::string unit = flat ? "element" : t.dim == 0 && t.blocks == 1 ? "row" : "slice";
  if (!flat && (t.dim < 0 || t.dim >= static_cast<int64_t>(t.shape.size())))
    bad(where, what + " of shape " + shape_str(t.shape) + " is sharded on dim " +
                   std::to_string(t.dim) + ", which it does not have");
  if (!flat && (t.blocks < 1 || t.shape[static_cast<size_t>(t.dim)] % t.blocks != 0))
    bad(where, what + " has " + std::to_string(t.blocks) + " blocks, which do not divide its " +
                   std::to_string(t.shape[static_cast<size_t>(t.dim)]) + " entries along dim " +
                   std::to_string(t.dim));
  if (t.shards.empty()) bad(where, what + " has no shards");
  const int64_t total =
      flat ? shape_numel(t.shape) : t.shape[static_cast<size_t>(t.dim)] / t.blocks;
  std::stable_sort(t.shards.begin(), t.shards.end(),
                   [](const ShardRecord& a, const ShardRecord& b) {
                     return a.offset != b.offset ? a.offset < b.offset : a.length < b.length;
                   });
  int64_t pos = 0;
  for (size_t i = 0; i < t.shards.size(); ++i) {
    const ShardRecord& s = t.shards[i];
    if (s.offset > total || s.length > total - s.offset)
      bad(where, what + " has a shard of " + unit + "s [" + std::to_string(s.offset) + ", +" +
                     std::to_string(s.length) + ") outside its " + std::to_string(total) + " " +
                     unit + "s");
    if (s.length == 0) continue;
    if (i > 0 && s.offset == t.shards[i - 1].offset && s.length == t.shards[i - 1].length) continue;
    if (s.offset != pos)
      bad(where, what + " has a shard at " + unit + " " + std::to_string(s.offset) + ", expected " +
                     std::to_string(pos) + (s.offset < pos ? " (overlap)" : " (gap)"));
    pos += s.length;
  }
  if (pos != total)
    bad(where, what + " shards cover " + std::to_string(pos) + " of " + std::to_string(total) +
                   " " + unit + "s (gap at the end)");
}

}  // namespace

std::string shard_kind_name(ShardKind kind) {
  switch (kind) {
    case ShardKind::replicated:
      return "replicated";
    case ShardKind::dim:
      return "dim";
    case ShardKind::flat:
      return "flat";
  }
  MT_THROW(ValueError, "bad shard kind ", static_cast<int>(kind));
}

ShardKind parse_shard_kind(const std::string& name) {
  for (ShardKind k : {ShardKind::replicated, ShardKind::dim, ShardKind::flat})
    if (shard_kind_name(k) == name) return k;
  MT_THROW(ValueError, "unknown shard kind '", name, "' (replicated, dim or flat)");
}

void check_group_name(const std::string& group) {
  const bool ok =
      !group.empty() && group.size() <= 64 &&
      group.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") == std::string::npos;
  if (!ok) MT_THROW(ValueError, "checkpoint group name '", group, "' must match [a-z0-9_]+");
}

std::string shard_file_name(const std::string& group, int64_t rank) {
  check_group_name(group);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "_rank%05lld.safetensors", static_cast<long long>(rank));
  return group + buf;
}

const TensorRecord* Manifest::find_tensor(const std::string& name) const {
  for (const TensorRecord& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

const TensorRecord& Manifest::tensor(const std::string& name) const {
  const TensorRecord* t = find_tensor(name);
  if (t == nullptr) MT_THROW(ValueError, "no tensor '", name, "' in the checkpoint of step ", step);
  return *t;
}

const FileRecord* Manifest::find_file(const std::string& name) const {
  for (const FileRecord& f : files)
    if (f.name == name) return &f;
  return nullptr;
}

nlohmann::ordered_json Manifest::to_json() const {
  OJson j;
  j["format"] = kFormatName;
  j["format_version"] = format_version;
  j["software_version"] = software_version;
  j["step"] = step;
  j["epoch"] = epoch;
  j["world"] = {{"world_size", world.world_size},
                {"dp", world.dp},
                {"tp", world.tp},
                {"pp", world.pp},
                {"zero_stage", world.zero_stage}};
  OJson ts = OJson::array();
  for (const TensorRecord& t : tensors) {
    OJson e;
    e["name"] = t.name;
    e["group"] = t.group;
    e["dtype"] = std::string(dtype_name(t.dtype));
    e["shape"] = t.shape;
    if (t.kind == ShardKind::replicated) {
      e["sharding"] = "replicated";
      OJson copies = OJson::array();
      for (const ShardRecord& s : t.shards) copies.push_back({{"rank", s.rank}, {"file", s.file}});
      e["copies"] = std::move(copies);
    } else {
      OJson shards = OJson::array();
      for (const ShardRecord& s : t.shards)
        shards.push_back(
            {{"rank", s.rank}, {"offset", s.offset}, {"length", s.length}, {"file", s.file}});
      if (t.kind == ShardKind::flat)
        e["sharding"] = {{"kind", "flat"}, {"shards", std::move(shards)}};
      else if (t.blocks > 1)
        e["sharding"] = {{"dim", t.dim}, {"blocks", t.blocks}, {"shards", std::move(shards)}};
      else
        e["sharding"] = {{"dim", t.dim}, {"shards", std::move(shards)}};
    }
    ts.push_back(std::move(e));
  }
  j["tensors"] = std::move(ts);
  OJson fs = OJson::array();
  for (const FileRecord& f : files)
    fs.push_back(
        {{"name", f.name}, {"rank", f.rank}, {"bytes", f.bytes}, {"xxh3", hash_hex(f.xxh3)}});
  j["files"] = std::move(fs);
  j["train_state"] = train_state;
  return j;
}

Manifest Manifest::from_json(const nlohmann::json& j, const std::string& where) {
  try {
    if (!j.is_object()) bad(where, "not a JSON object");
    if (get_str(j, "format", where) != kFormatName)
      bad(where, "\"format\" is not " + std::string(kFormatName));
    Manifest m;
    m.format_version = get_int(j, "format_version", where);
    if (m.format_version != kManifestFormatVersion)
      bad(where, "format version " + std::to_string(m.format_version) +
                     " is not supported (this build reads version " +
                     std::to_string(kManifestFormatVersion) + ")");
    m.software_version = get_str(j, "software_version", where);
    m.step = get_nonneg(j, "step", where);
    m.epoch = get_nonneg(j, "epoch", where);
    if (!j.contains("world") || !j.at("world").is_object()) bad(where, "\"world\" is missing");
    const Json& w = j.at("world");
    m.world.world_size = get_nonneg(w, "world_size", where);
    m.world.dp = get_nonneg(w, "dp", where);
    m.world.tp = get_nonneg(w, "tp", where);
    m.world.pp = get_nonneg(w, "pp", where);
    m.world.zero_stage = get_nonneg(w, "zero_stage", where);
    if (m.world.world_size < 1) bad(where, "world_size is below 1");

    std::set<std::string> file_names;
    for (const Json& f : get_array(j, "files", where)) {
      if (!f.is_object()) bad(where, "a file entry is not an object");
      FileRecord r;
      r.name = get_str(f, "name", where);
      if (!safe_file_name(r.name) || r.name == kManifestFile)
        bad(where, "file name '" + r.name + "' is not allowed");
      if (!file_names.insert(r.name).second) bad(where, "file '" + r.name + "' is listed twice");
      r.rank = get_nonneg(f, "rank", where);
      if (!f.contains("bytes") || !f.at("bytes").is_number_unsigned())
        bad(where, "file '" + r.name + "' has no byte size");
      r.bytes = f.at("bytes").get<uint64_t>();
      r.xxh3 = parse_hex(get_str(f, "xxh3", where), where);
      m.files.push_back(std::move(r));
    }

    std::set<std::string> names;
    for (const Json& e : get_array(j, "tensors", where)) {
      if (!e.is_object()) bad(where, "a tensor entry is not an object");
      TensorRecord t;
      t.name = get_str(e, "name", where);
      if (t.name.empty() || !names.insert(t.name).second)
        bad(where, "tensor name '" + t.name + "' is empty or repeated");
      t.group = get_str(e, "group", where);
      try {
        check_group_name(t.group);
        t.dtype = parse_dtype(get_str(e, "dtype", where));
      } catch (const ValueError& err) {
        bad(where, "tensor '" + t.name + "': " + err.what());
      }
      // Element counts stay far from overflow even as byte counts of the widest dtype.
      constexpr int64_t kMaxNumel = int64_t{1} << 59;
      int64_t numel = 1;
      for (const Json& d : get_array(e, "shape", where)) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          bad(where, "tensor '" + t.name + "' has a bad dimension " + d.dump());
        const int64_t n = d.get<int64_t>();
        if (n != 0 && numel > kMaxNumel / n)
          bad(where, "tensor '" + t.name + "' has more than 2^59 elements");
        numel *= n;
        t.shape.push_back(n);
      }
      if (!e.contains("sharding")) bad(where, "tensor '" + t.name + "' has no sharding");
      const Json& sh = e.at("sharding");
      if (sh.is_string() && sh.get<std::string>() == "replicated") {
        t.kind = ShardKind::replicated;
        for (const Json& c : get_array(e, "copies", where))
          t.shards.push_back(parse_shard(c, where));
        if (t.shards.empty()) bad(where, "tensor '" + t.name + "' has no copies");
        for (ShardRecord& s : t.shards) {
          s.offset = 0;
          s.length = t.shape.empty() ? 1 : t.shape[0];
        }
      } else if (sh.is_object() && (sh.contains("kind") ? get_str(sh, "kind", where) == "flat"
                                                        : sh.contains("dim"))) {
        t.kind = sh.contains("kind") ? ShardKind::flat : ShardKind::dim;
        if (t.kind == ShardKind::dim) {
          t.dim = get_nonneg(sh, "dim", where);
          if (sh.contains("blocks")) t.blocks = get_nonneg(sh, "blocks", where);
        }
        for (const Json& c : get_array(sh, "shards", where))
          t.shards.push_back(parse_shard(c, where));
        check_tiling(t, where);
      } else {
        bad(where, "tensor '" + t.name + "' has unsupported sharding " + sh.dump());
      }
      for (const ShardRecord& s : t.shards) {
        if (file_names.count(s.file) == 0)
          bad(where, "tensor '" + t.name + "' is in file '" + s.file + "', which is not listed");
        if (s.rank >= m.world.world_size)
          bad(where, "tensor '" + t.name + "' has a shard of rank " + std::to_string(s.rank) +
                         " outside world size " + std::to_string(m.world.world_size));
      }
      m.tensors.push_back(std::move(t));
    }
    if (!j.contains("train_state") || !j.at("train_state").is_object())
      bad(where, "\"train_state\" is missing or not an object");
    m.train_state = j.at("train_state");
    return m;
  } catch (const nlohmann::json::exception& e) {
    bad(where, e.what());
  }
}

std::string manifest_text(const Manifest& m) {
  OJson j = m.to_json();
  j["checksum"] = hash_hex(xxh3_64(j.dump(2)));
  return j.dump(2) + "\n";
}

Manifest parse_manifest(const std::string& text, const std::string& path) {
  OJson j;
  try {
    j = OJson::parse(text);
  } catch (const nlohmann::json::exception& e) {
    bad(path, std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object() || !j.contains("checksum") || !j["checksum"].is_string())
    bad(path, "no \"checksum\"");
  const uint64_t want = parse_hex(j["checksum"].get<std::string>(), path);
  j.erase("checksum");
  const uint64_t got = xxh3_64(j.dump(2));
  if (got != want)
    bad(path, "checksum mismatch: content xxh3 " + hash_hex(got) + ", recorded " + hash_hex(want));
  return Manifest::from_json(Json::parse(text), path);
}

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = (std::filesystem::path(step_dir) / kManifestFile).string();
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) MT_THROW(IoError, "checkpoint manifest ", path, ": ", ec.message());
  if (size > kMaxManifestBytes) bad(path, "larger than 256 MiB");
  std::ifstream in(path, std::ios::binary);
  if (!in) MT_THROW(IoError, "cannot open ", path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return parse_manifest(ss.str(), path);
}

}  // namespace meshtrain::ckpt
