// PsLayout: who is what in a parameter-server job and which server holds which parameters. The
// job's first `workers` ranks train, its last `servers` ranks serve. The keys are the model's
// parameters in the model's order; each server holds a contiguous range of whole parameters,
// the ranges balanced by bytes. Whole parameters (rather than byte ranges that cut a tensor) let
// a server sum each parameter's squared gradient as a data-parallel rank sums it, so the servers
// agree on the very bits of the gradient norm that an all-reduce job computes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshtrain::parallel {

// [begin, end) of the parameters a server holds.
struct KeyRange {
  size_t begin = 0;
  size_t end = 0;
};

// Splits parameters of the given sizes (elements, in order) into `servers` contiguous ranges so
// that the largest range is as small as it can be (a range may be empty only when there are
// fewer parameters than servers).
std::vector<KeyRange> balanced_key_ranges(const std::vector<int64_t>& sizes, int servers);

struct PsLayout {
  PsLayout(int workers, int servers, const std::vector<int64_t>& param_sizes);

  int workers = 0;
  int servers = 0;
  std::vector<KeyRange> ranges;  // per server
  // Element offsets of every parameter in the flat order, and of every server's range.
  std::vector<int64_t> param_offset;  // parameters + 1 entries
  int64_t total = 0;

  int server_rank(int server) const { return workers + server; }  // in the job's group
  int64_t range_offset(int server) const;
  int64_t range_size(int server) const;
};

}  // namespace meshtrain::parallel
