#include "meshtrain/parallel/mesh/device_mesh.h"

#include <algorithm>
#include <set>
#include <sstream>

#include "meshtrain/util/error.h"

namespace meshtrain::parallel {

DeviceMesh::DeviceMesh(comm::ProcessGroupPtr world, std::vector<MeshDim> dims,
                       const std::vector<std::vector<std::string>>& combined)
    : world_(std::move(world)), dims_(std::move(dims)) {
  MT_CHECK(!dims_.empty(), "a device mesh needs at least one dimension");
  std::set<std::string> names;
  int64_t product = 1;
  for (const MeshDim& d : dims_) {
    MT_CHECK(!d.name.empty(), "a mesh dimension needs a name");
    MT_CHECK(names.insert(d.name).second, "mesh dimension '", d.name, "' appears twice");
    MT_CHECK(d.size >= 1, "mesh dimension '", d.name, "' has size ", d.size, "; sizes are >= 1");
    product *= d.size;
  }
  world_size_ = world_ ? world_->size() : 1;
  rank_ = world_ ? world_->rank() : 0;
  if (product != world_size_) {
    std::ostringstream os;
    for (size_t i = 0; i < dims_.size(); ++i)
      os << (i ? " x " : "") << dims_[i].name << "=" << dims_[i].size;
    MT_THROW(ValueError, "the mesh ", os.str(), " has ", product, " ranks but the job has ",
             world_size_, "; the product of the degrees must equal the world size");
  }
  strides_.assign(dims_.size(), 1);
  for (size_t i = dims_.size() - 1; i > 0; --i) strides_[i - 1] = strides_[i] * dims_[i].size;
  for (size_t i = 0; i < dims_.size(); ++i) coords_.push_back(rank_ / strides_[i] % dims_[i].size);

  // The fixed order: single dimensions as declared, then the combinations as given.
  for (const MeshDim& d : dims_) groups_[key({d.name})] = build({d.name});
  for (const auto& c : combined) {
    MT_CHECK(!c.empty(), "an empty set of mesh dimensions has no group");
    for (const std::string& n : c) index(n);  // names checked
    const std::string k = key(c);
    if (!groups_.count(k)) groups_[k] = build(c);
  }
}

std::vector<int> DeviceMesh::split_sizes(const std::vector<MeshDim>& dims,
                                         const std::vector<std::vector<std::string>>& combined) {
  int world = 1;
  for (const MeshDim& d : dims) world *= std::max(1, d.size);
  auto size_of = [&](const std::string& name) {
    for (const MeshDim& d : dims)
      if (d.name == name) return std::max(1, d.size);
    return 1;
  };
  // As the constructor: single dimensions, then the combinations not made yet; build() splits
  // once per group, except where the group is one rank or the whole world.
  std::vector<int> out;
  std::set<std::set<std::string>> made;
  auto add = [&](const std::vector<std::string>& names) {
    const std::set<std::string> k(names.begin(), names.end());
    if (!made.insert(k).second) return;
    int members = 1;
    for (const std::string& n : k) members *= size_of(n);
    if (members == 1 || members == world) return;
    out.insert(out.end(), static_cast<size_t>(world / members), members);
  };
  for (const MeshDim& d : dims) add({d.name});
  for (const auto& c : combined) add(c);
  return out;
}

size_t DeviceMesh::index(std::string_view dim) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == dim) return i;
  std::ostringstream os;
  for (size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i].name;
  MT_THROW(ValueError, "the mesh has no dimension '", dim, "' (it has ", os.str(), ")");
}

std::string DeviceMesh::key(std::vector<std::string> dims) const {
  // Mesh order, whatever order the caller named them in.
  std::sort(dims.begin(), dims.end(),
            [this](const std::string& a, const std::string& b) { return index(a) < index(b); });
  std::string k;
  for (const std::string& d : dims) k += (k.empty() ? "" : ",") + d;
  return k;
}

std::vector<int> DeviceMesh::group_ranks(const std::vector<std::string>& dims) const {
  std::vector<bool> varies(dims_.size(), false);
  for (const std::string& d : dims) varies[index(d)] = true;
  // Ranks sharing this rank's coordinates outside `dims`, in mesh order (last dim fastest).
  std::vector<int> out;
  for (int r = 0; r < world_size_; ++r) {
    bool same = true;
    for (size_t i = 0; i < dims_.size() && same; ++i)
      if (!varies[i] && r / strides_[i] % dims_[i].size != coords_[i]) same = false;
    if (same) out.push_back(r);
  }
  return out;
}

comm::ProcessGroupPtr DeviceMesh::build(const std::vector<std::string>& dims) {
  int members = 1;
  std::vector<bool> varies(dims_.size(), false);
  for (const std::string& d : dims) {
    varies[index(d)] = true;
    members *= dims_[index(d)].size;
  }
  if (members == 1) return nullptr;
  if (members == world_size_) return world_;
  // Every rank takes part in every split, one per group, ordered by the group's first rank.
  comm::ProcessGroupPtr mine;
  for (int first = 0; first < world_size_; ++first) {
    bool is_first = true;
    for (size_t i = 0; i < dims_.size(); ++i)
      if (varies[i] && first / strides_[i] % dims_[i].size != 0) is_first = false;
    if (!is_first) continue;
    std::vector<int> ranks;
    for (int r = 0; r < world_size_; ++r) {
      bool same = true;
      for (size_t i = 0; i < dims_.size() && same; ++i)
        if (!varies[i] && r / strides_[i] % dims_[i].size != first / strides_[i] % dims_[i].size)
          same = false;
      if (same) ranks.push_back(r);
    }
    comm::ProcessGroupPtr g = world_->split(ranks);
    if (g) mine = std::move(g);
  }
  return mine;
}

bool DeviceMesh::has(std::string_view dim) const {
  return std::any_of(dims_.begin(), dims_.end(), [&](const MeshDim& d) { return d.name == dim; });
}

int DeviceMesh::size(std::string_view dim) const {
  return dims_[index(dim)].size;
}

int DeviceMesh::coord(std::string_view dim) const {
  return coords_[index(dim)];
}

int DeviceMesh::rank_of(const std::vector<int>& coords) const {
  MT_CHECK(coords.size() == dims_.size(), "rank_of: ", coords.size(), " coordinates for a mesh of ",
           dims_.size(), " dimensions");
  int r = 0;
  for (size_t i = 0; i < dims_.size(); ++i) {
    MT_CHECK(coords[i] >= 0 && coords[i] < dims_[i].size, "rank_of: coordinate ", coords[i],
             " is outside dimension '", dims_[i].name, "' of size ", dims_[i].size);
    r += coords[i] * strides_[i];
  }
  return r;
}

const comm::ProcessGroupPtr& DeviceMesh::group(std::string_view dim) const {
  return group(std::vector<std::string>{std::string(dim)});
}

const comm::ProcessGroupPtr& DeviceMesh::group(const std::vector<std::string>& dims) const {
  const auto it = groups_.find(key(dims));
  MT_CHECK(it != groups_.end(), "the mesh has no group for {", key(dims),
           "}: name the combination when the mesh is built (groups are never created later)");
  return it->second;
}

std::string DeviceMesh::describe() const {
  std::ostringstream os;
  for (size_t i = 0; i < dims_.size(); ++i)
    os << (i ? " x " : "") << dims_[i].name << "=" << dims_[i].size;
  os << " (rank " << rank_ << " at";
  for (size_t i = 0; i < dims_.size(); ++i) os << " " << dims_[i].name << "=" << coords_[i];
  os << ")";
  return os.str();
}

}  // namespace meshtrain::parallel
