// Expert parallelism as a mixture-of-experts layer sees it: the ranks that share out its experts
// (rank r of size() holds experts [r * k, (r + 1) * k), k = num_experts / size()) and the
// all-to-all that carries each expert's tokens to its rank and the outputs back. The engine
// implements it over the expert-parallel process group (parallel/expert/); a layer without one
// holds every expert. The layer stays free of the communication library, as the engine's other
// seams keep the model's code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace meshtrain::nn {

class ExpertExchange {
 public:
  virtual ~ExpertExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: sends send[p * per_peer, (p + 1) * per_peer) to each rank p and returns what
  // every rank sent here, laid out the same by source rank.
  virtual std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send,
                                               size_t per_peer) = 0;
  // Collective: f32 blocks to each rank back to back in rank order (send_elems[p] of them to p),
  // received the same way (recv_elems[p] from p).
  virtual void all_to_all(const float* in, const std::vector<size_t>& send_elems, float* out,
                          const std::vector<size_t>& recv_elems) = 0;
  // Seconds spent in the two collectives since the last call.
  virtual double take_seconds() = 0;
};

}  // namespace meshtrain::nn
