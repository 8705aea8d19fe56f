// DeviceMesh: the ranks of a job arranged on named dimensions ({"pp", 2}, {"dp", 2}, {"tp", 2}),
// the last varying fastest so that a tensor-parallel group is made of neighbouring ranks (one
// host). Every sub-group is created in the constructor, collectively and in a fixed order, so no
// getter ever communicates: a group created lazily by a getter is a hidden collective that hangs
// as soon as two ranks take different paths. The mesh is passed explicitly; there is no global
// parallel state.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "meshtrain/comm/process_group.h"

namespace meshtrain::parallel {

struct MeshDim {
  std::string name;
  int size = 1;
};

class DeviceMesh {
 public:
  // Collective over `world` (null: one process, every dimension of size 1). The product of the
  // sizes must be the world size. `combined` lists sets of dimensions that also get a group of
  // their own (e.g. {"dp", "tp"}); the single dimensions always do.
  DeviceMesh(comm::ProcessGroupPtr world, std::vector<MeshDim> dims,
             const std::vector<std::vector<std::string>>& combined = {});

  // The rank counts of the groups a mesh of `dims` (and `combined`) splits off the world, in the
  // order it makes them, one entry per split: what the world group is told to plan its shm budget
  // for (ProcessGroupOptions::shm_budget.planned_groups) before the mesh exists.
  static std::vector<int> split_sizes(const std::vector<MeshDim>& dims,
                                      const std::vector<std::vector<std::string>>& combined = {});

  // The whole job, in the order the mesh numbers it.
  const comm::ProcessGroupPtr& world() const { return world_; }
  int rank() const { return rank_; }
  int size() const { return world_size_; }
  const std::vector<MeshDim>& dims() const { return dims_; }
  bool has(std::string_view dim) const;
  int size(std::string_view dim) const;
  // This rank's position along a dimension.
  int coord(std::string_view dim) const;
  const std::vector<int>& coords() const { return coords_; }
  // The rank at the given coordinates (one per dimension, in order).
  int rank_of(const std::vector<int>& coords) const;
  // The group of the ranks that differ from this one only along `dim` (only along `dims`),
  // ranked by their coordinates there. Null where that set is this rank alone: a dimension of
  // size 1 needs no communication, as a one-process run has no group.
  const comm::ProcessGroupPtr& group(std::string_view dim) const;
  const comm::ProcessGroupPtr& group(const std::vector<std::string>& dims) const;
  // The members of this rank's group along `dims`, as world ranks, in group-rank order.
  std::vector<int> group_ranks(const std::vector<std::string>& dims) const;
  // "pp=2 x dp=2 x tp=2 (rank 5 at pp=1 dp=0 tp=1)".
  std::string describe() const;

 private:
  std::string key(std::vector<std::string> dims) const;
  size_t index(std::string_view dim) const;
  comm::ProcessGroupPtr build(const std::vector<std::string>& dims);

  comm::ProcessGroupPtr world_;
  std::vector<MeshDim> dims_;
  std::vector<int> strides_;
  std::vector<int> coords_;
  int rank_ = 0;
  int world_size_ = 1;
  std::map<std::string, comm::ProcessGroupPtr, std::less<>> groups_;
};

}  // namespace meshtrain::parallel
