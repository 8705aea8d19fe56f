// The oneDNN engine and streams the CPU kernels that run on oneDNN share (convolutions, matrix
// products): one CPU engine per process, one stream per thread, so that threads (ranks run as
// threads in tests, OpenMP loops) never share a stream.
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>

namespace meshtrain::cpu {

dnnl::engine& onednn_engine();
dnnl::stream& onednn_stream();  // the calling thread's

// Past this many cached primitives per thread a kernel's cache starts over: a model has a few
// dozen shapes, so only a caller cycling through many batch sizes gets here.
inline constexpr size_t kOnednnMaxCached = 512;

}  // namespace meshtrain::cpu
