// See onednn_context.h.
#include "meshtrain/tensor/cpu/onednn_context.h"

namespace meshtrain::cpu {

dnnl::engine& onednn_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

dnnl::stream& onednn_stream() {
  thread_local dnnl::stream s(onednn_engine());
  return s;
}

}  // namespace meshtrain::cpu
