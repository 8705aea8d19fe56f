// The row-wise parts of a cross-entropy whose logits are split by vocabulary over the ranks of a
// tensor-parallel group (Megatron's vocab-parallel loss): each rank holds columns [begin, begin +
// valid) of the whole vocabulary as logits[N, V] (V >= valid: padding columns past valid are
// ignored). The caller combines the parts over the group between the calls (the row maxima by
// max, the sums by sum), so no rank ever holds a whole row. The device's kernels
// (cuda/kernels/vocab_parallel_cross_entropy.h) compute the same parts.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// max[n] = the largest of logits[n, 0..valid) (-inf where valid is 0).
void vocab_parallel_row_max(float* max, const float* logits, int64_t N, int64_t V, int64_t valid);

// With max[n] the row's maximum over the whole vocabulary: sum[n] = the sum of exp(logits[n, v] -
// max[n]) over v < valid (added in double in column order, rounded once), and target_logit[n] =
// logits[n, targets[n] - begin] where this rank holds the target and it is not ignore_index,
// else 0.
void vocab_parallel_row_sums(float* sum, float* target_logit, const float* logits, const float* max,
                             const int32_t* targets, int64_t N, int64_t V, int64_t valid,
                             int64_t begin, int32_t ignore_index);

// The mean loss from the combined rows: out[0] = the mean over the rows not ignored of
// log(sum[n]) + max[n] - target_logit[n], added in double in row order (NaN where no row counts,
// or where a counted target is negative: a bad target cannot throw on a device); out[1] = the
// count of those rows (exact below 2^24).
void vocab_parallel_loss_mean(float* out, const float* max, const float* sum,
                              const float* target_logit, const int32_t* targets, int64_t N,
                              int32_t ignore_index);

// WRITES dlogits[N, V] = (softmax - onehot(target)) * scale for the rows not ignored and the
// columns held, zeros elsewhere; max and sum are the combined rows.
void vocab_parallel_backward(float* dlogits, const float* logits, const float* max,
                             const float* sum, const int32_t* targets, int64_t N, int64_t V,
                             int64_t valid, int64_t begin, int32_t ignore_index, float scale);

}  // namespace meshtrain::cpu
