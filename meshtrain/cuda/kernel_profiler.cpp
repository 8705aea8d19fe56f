#include "meshtrain/cuda/kernel_profiler.h"

#include <algorithm>
#include <map>

#include "meshtrain/cuda/check.h"
#include "meshtrain/cuda/caching_allocator.h"

namespace meshtrain::cuda {

KernelProfiler::Span::Span(KernelProfiler& p, const char* op, Device device)
    : p_(p), op_(op), device_(device) {
  MT_CUDA_CHECK(cudaEventCreate(&start_));
  MT_CUDA_CHECK(cudaEventRecord(start_, current_stream(device_.index)));
}

KernelProfiler::Span::~Span() {
  // A destructor cannot throw: a failed record leaves this call out of the report.
  cudaEvent_t stop = nullptr;
  if (cudaEventCreate(&stop) != cudaSuccess) {
    (void)cudaEventDestroy(start_);
    return;
  }
  if (cudaEventRecord(stop, current_stream(device_.index)) != cudaSuccess) {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop);
    return;
  }
  p_.records_.push_back({op_, start_, stop});
}

KernelProfiler::~KernelProfiler() {
  for (const Record& r : records_) {
    (void)cudaEventDestroy(r.start);
    (void)cudaEventDestroy(r.stop);
  }
}

std::vector<OpTime> KernelProfiler::report() {
  std::map<std::string, OpTime> by_op;
  for (const Record& r : records_) {
    MT_CUDA_CHECK(cudaEventSynchronize(r.stop));
    float ms = 0;
    MT_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
    OpTime& t = by_op[r.op];
    t.op = r.op;
    ++t.calls;
    t.ms += ms;
  }
  for (const Record& r : records_) {
    (void)cudaEventDestroy(r.start);
    (void)cudaEventDestroy(r.stop);
  }
  records_.clear();
  std::vector<OpTime> out;
  for (auto& [op, t] : by_op) out.push_back(t);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace meshtrain::cuda
