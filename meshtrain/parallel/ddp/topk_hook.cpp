// Top-k sparsification with error feedback (see topk_hook.h for the wire format and costs).
#include "meshtrain/parallel/ddp/topk_hook.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <sstream>

namespace meshtrain::parallel {

namespace {

// Selection key: NaN sorts as the largest magnitude so that a broken gradient is sent (and the
// step gets skipped by the trainer's finiteness check) instead of hiding in the residual.
float magnitude(float v) {
  return std::isnan(v) ? std::numeric_limits<float>::infinity() : std::fabs(v);
}

}  // namespace

TopKHook::TopKHook(TopKOptions options) : options_(options) {
  if (!(options_.ratio > 0 && options_.ratio <= 1))
    MT_THROW(ValueError, "top-k ratio must be in (0, 1], got ", options_.ratio);
}

std::string TopKHook::name() const {
  std::ostringstream os;
  os << "topk:" << options_.ratio;
  return os.str();
}

int64_t TopKHook::k_for(int64_t n) const {
  const auto k = static_cast<int64_t>(std::ceil(options_.ratio * static_cast<double>(n)));
  return std::clamp<int64_t>(k, 1, std::max<int64_t>(n, 1));
}

size_t TopKHook::wire_bytes(const GradBucket& bucket) const {
  return static_cast<size_t>(k_for(bucket.buffer.numel())) * 8;
}

comm::WorkPtr TopKHook::launch(GradBucket& bucket, comm::ProcessGroup& pg) {
  const int64_t n = bucket.buffer.numel();
  MT_CHECK(n > 0 && n <= std::numeric_limits<int32_t>::max(), "top-k bucket of ", n,
           " elements: indices must fit in int32");
  float* b = bucket.buffer.data<float>();
  const std::vector<BucketParam> params = bucket_params(bucket);

  // Error feedback: what was held back last step joins this step's gradient.
  for (const BucketParam& p : params) {
    auto it = residuals_.find(p.name);
    if (it == residuals_.end()) continue;
    MT_CHECK(it->second.numel() == p.numel(), "top-k residual for '", p.name, "' has ",
             it->second.numel(), " elements, the parameter ", p.numel());
    const float* r = it->second.data<float>();
    float* dst = b + p.offset;
    for (int64_t i = 0; i < p.numel(); ++i) dst[i] += r[i];
  }

  // The k-th largest magnitude is the threshold; entries above it are sent, ties at it are
  // taken in index order, so the selection is exactly k entries and deterministic.
  const int64_t k = k_for(n);
  magnitudes_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) magnitudes_[static_cast<size_t>(i)] = magnitude(b[i]);
  std::nth_element(magnitudes_.begin(), magnitudes_.begin() + (k - 1), magnitudes_.end(),
                   std::greater<float>());
  const float threshold = magnitudes_[static_cast<size_t>(k - 1)];
  int64_t above = 0;
  for (int64_t i = 0; i < n; ++i) above += magnitude(b[i]) > threshold ? 1 : 0;
  int64_t ties_left = k - above;

  if (staging_.size() <= static_cast<size_t>(bucket.index)) staging_.resize(bucket.index + 1);
  Staging& st = staging_[static_cast<size_t>(bucket.index)];
  st.k = k;
  st.world = pg.size();
  st.send.resize(static_cast<size_t>(2 * k));
  st.recv.resize(static_cast<size_t>(2 * k) * static_cast<size_t>(pg.size()));
  int32_t* idx = st.send.data();
  int32_t* val = st.send.data() + k;
  int64_t taken = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float m = magnitude(b[i]);
    const bool pick = m > threshold || (m == threshold && ties_left > 0);
    if (!pick) continue;
    if (m == threshold) --ties_left;
    idx[taken] = static_cast<int32_t>(i);
    std::memcpy(&val[taken], &b[i], sizeof(float));
    ++taken;
    b[i] = 0;  // what stays in the buffer is the new residual
  }
  MT_CHECK(taken == k, "top-k selected ", taken, " entries instead of ", k);

  for (const BucketParam& p : params) {
    Tensor& r = residuals_[p.name];
    if (!r.defined() || r.numel() != p.numel()) r = Tensor::empty(p.shape);
    std::memcpy(r.data<float>(), b + p.offset, static_cast<size_t>(p.numel()) * sizeof(float));
  }
  return pg.all_gather(st.send.data(), st.recv.data(), st.send.size(), DType::i32);
}

void TopKHook::finish(GradBucket& bucket) {
  const Staging& st = staging_.at(static_cast<size_t>(bucket.index));
  const int64_t n = bucket.buffer.numel();
  float* b = bucket.buffer.data<float>();
  std::memset(b, 0, static_cast<size_t>(n) * sizeof(float));
  // Rank order, so that every rank adds the same numbers in the same order.
  for (int r = 0; r < st.world; ++r) {
    const int32_t* idx = st.recv.data() + static_cast<size_t>(r) * static_cast<size_t>(2 * st.k);
    const int32_t* val = idx + st.k;
    for (int64_t j = 0; j < st.k; ++j) {
      const int32_t i = idx[j];
      MT_CHECK(i >= 0 && i < n, "top-k index ", i, " from rank ", r, " outside the bucket of ", n);
      float v;
      std::memcpy(&v, &val[j], sizeof(float));
      b[i] += v;
    }
  }
}

nn::NamedTensors TopKHook::state_dict() const {
  nn::NamedTensors out;
  for (const auto& [name, r] : residuals_) out.emplace_back("residual." + name, r.clone());
  return out;
}

void TopKHook::load_state_dict(const nn::NamedTensors& state) {
  std::map<std::string, Tensor> loaded;
  for (const auto& [key, t] : state) {
    if (key.rfind("residual.", 0) != 0)
      MT_THROW(ValueError, "top-k hook state: unexpected entry '", key, "'");
    if (t.dtype() != DType::f32)
      MT_THROW(ValueError, "top-k hook state: '", key, "' is ", dtype_name(t.dtype()),
               ", expected f32");
    loaded[key.substr(9)] = t.clone();
  }
  residuals_ = std::move(loaded);
}

}  // namespace meshtrain::parallel
