// Cross-entropy over logits, fused: log-softmax and negative log-likelihood in one pass per row,
// so the [N, V] probabilities are never stored. Rows whose target equals ignore_index count for
// nothing and are left out of the mean, as in torch.nn.functional.cross_entropy. With
// label_smoothing eps > 0 the target is (1 - eps) on the label plus eps / V on every class, as
// PyTorch's label_smoothing: loss = (1 - eps) * nll + eps * mean over classes of -log p.
#pragma once

#include <cstdint>

namespace meshtrain::cpu {

// For logits[N, V] and targets[N]: losses[N] = logsumexp(row) - row[target] (0 for ignored rows)
// and lse[N] = logsumexp(row), saved for the backward. Returns the mean loss over the non-ignored
// rows, summed in double in row order (NaN when every row is ignored, like PyTorch). A target
// outside [0, V) that is not ignore_index, or label_smoothing outside [0, 1), fails an MT_CHECK.
float cross_entropy_forward(float* losses, float* lse, const float* logits, const int32_t* targets,
                            int64_t N, int64_t V, int32_t ignore_index = -100,
                            float label_smoothing = 0.0f);

// Writes dlogits[N, V] = (softmax(row) - smoothed target) * dloss / count, where the smoothed
// target is onehot(target) without label smoothing, dloss is the gradient of the mean loss and
// count the number of non-ignored rows; ignored rows get zeros.
void cross_entropy_backward(float* dlogits, const float* logits, const float* lse,
                            const int32_t* targets, float dloss, int64_t N, int64_t V,
                            int32_t ignore_index = -100, float label_smoothing = 0.0f);

// The number of rows whose target is not ignore_index.
int64_t cross_entropy_count(const int32_t* targets, int64_t N, int32_t ignore_index);

}  // namespace meshtrain::cpu
