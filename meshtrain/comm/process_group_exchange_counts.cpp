// ProcessGroup::exchange_counts: the receive side of an all_to_all_v from the send side alone.
#include <cstdint>

#include "meshtrain/comm/process_group.h"
#include "meshtrain/util/error.h"

namespace meshtrain::comm {

std::vector<size_t> ProcessGroup::exchange_counts(const std::vector<size_t>& send_counts,
                                                  const AllToAllOptions& opts) {
  const size_t n = static_cast<size_t>(size());
  MT_CHECK(send_counts.size() == n, "exchange_counts needs ", n, " counts, got ",
           send_counts.size());
  // i64 on the wire: every backend moves it (nccl has no unsigned 64-bit type of ours), and no
  // buffer holds 2^63 elements.
  std::vector<int64_t> out(n), in(n);
  for (size_t j = 0; j < n; ++j) {
    MT_CHECK(send_counts[j] <= static_cast<size_t>(INT64_MAX), "exchange_counts: count ",
             send_counts[j], " too large");
    out[j] = static_cast<int64_t>(send_counts[j]);
  }
  all_to_all(out.data(), in.data(), 1, DType::i64, opts)->wait();
  std::vector<size_t> recv(n);
  for (size_t i = 0; i < n; ++i) {
    MT_CHECK(in[i] >= 0, "exchange_counts: rank ", i, " sent a negative count");
    recv[i] = static_cast<size_t>(in[i]);
  }
  return recv;
}

}  // namespace meshtrain::comm
