// PowerSGD with error feedback (see powersgd_hook.h). The factor products are plain loops: r is
// small, so they are bound by reading M once, and a fixed loop order keeps every rank's result
// of the same inputs bitwise identical.
#include "meshtrain/parallel/ddp/powersgd_hook.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <sstream>

#include "meshtrain/tensor/random.h"

namespace meshtrain::parallel {

namespace {

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

// P (n x r) = M (n x m) Q (m x r).
void matmul_mq(const float* M, const float* Q, float* P, int64_t n, int64_t m, int64_t r) {
  for (int64_t i = 0; i < n; ++i) {
    float* p = P + i * r;
    std::fill(p, p + r, 0.0f);
    const float* row = M + i * m;
    for (int64_t j = 0; j < m; ++j) {
      const float v = row[j];
      const float* q = Q + j * r;
      for (int64_t c = 0; c < r; ++c) p[c] += v * q[c];
    }
  }
}

// Q (m x r) = M^T P.
void matmul_mtp(const float* M, const float* P, float* Q, int64_t n, int64_t m, int64_t r) {
  std::fill(Q, Q + m * r, 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    const float* row = M + i * m;
    const float* p = P + i * r;
    for (int64_t j = 0; j < m; ++j) {
      float* q = Q + j * r;
      const float v = row[j];
      for (int64_t c = 0; c < r; ++c) q[c] += v * p[c];
    }
  }
}

// out (n x m) = P Q^T, or out -= P Q^T when subtract.
void outer(const float* P, const float* Q, float* out, int64_t n, int64_t m, int64_t r,
           bool subtract) {
  for (int64_t i = 0; i < n; ++i) {
    const float* p = P + i * r;
    float* o = out + i * m;
    for (int64_t j = 0; j < m; ++j) {
      const float* q = Q + j * r;
      float s = 0;
      for (int64_t c = 0; c < r; ++c) s += p[c] * q[c];
      o[j] = subtract ? o[j] - s : s;
    }
  }
}

// Orthonormalises the columns of P (n x r, row-major) in place by modified Gram-Schmidt with
// one re-orthogonalisation pass, in double. A column that is (numerically) in the span of the
// previous ones is replaced by a pseudo-random direction derived from `seed`, so that a
// rank-deficient gradient does not leave a zero column that the warm start would keep forever;
// when no direction is left (r > n) the column becomes zero. Every rank holds the same P after
// the all-reduce and runs the same arithmetic, so they agree bitwise.
void orthonormalise(float* P, int64_t n, int64_t r, uint64_t seed) {
  std::vector<double> cols(static_cast<size_t>(n * r));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < r; ++c) cols[static_cast<size_t>(c * n + i)] = P[i * r + c];
  auto col = [&](int64_t c) { return cols.data() + c * n; };
  auto norm = [&](const double* v) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += v[i] * v[i];
    return std::sqrt(s);
  };
  auto project_out = [&](double* v, int64_t upto) {
    for (int pass = 0; pass < 2; ++pass)
      for (int64_t k = 0; k < upto; ++k) {
        const double* u = col(k);
        double d = 0;
        for (int64_t i = 0; i < n; ++i) d += v[i] * u[i];
        for (int64_t i = 0; i < n; ++i) v[i] -= d * u[i];
      }
  };
  constexpr double kDegenerate = 1e-4;  // f32 inputs: anything smaller is rounding noise
  for (int64_t c = 0; c < r; ++c) {
    double* v = col(c);
    const double before = norm(v);
    project_out(v, c);
    double after = norm(v);
    if (!(before > 0) || !(after > kDegenerate * before)) {
      Generator g(seed ^ (0x632be59bd9b4e019ull * static_cast<uint64_t>(c + 1)));
      for (int64_t i = 0; i < n; ++i) v[i] = g.normal();
      const double fresh = norm(v);
      project_out(v, c);
      after = norm(v);
      if (!(after > kDegenerate * fresh)) after = 0;
    }
    const double scale = after > 0 ? 1.0 / after : 0.0;
    for (int64_t i = 0; i < n; ++i) v[i] *= scale;
  }
  for (int64_t i = 0; i < n; ++i)
    for (int64_t c = 0; c < r; ++c)
      P[i * r + c] = static_cast<float>(cols[static_cast<size_t>(c * n + i)]);
}

}  // namespace

PowerSGDHook::PowerSGDHook(PowerSGDOptions options) : options_(options) {
  if (options_.rank < 1) MT_THROW(ValueError, "PowerSGD rank must be >= 1, got ", options_.rank);
  if (options_.warmup_steps < 0)
    MT_THROW(ValueError, "PowerSGD warm-up steps must be >= 0, got ", options_.warmup_steps);
}

std::string PowerSGDHook::name() const {
  std::ostringstream os;
  os << "powersgd:" << options_.rank;
  if (options_.warmup_steps > 0) os << ':' << options_.warmup_steps;
  return os.str();
}

PowerSGDHook::Plan PowerSGDHook::make_plan(const GradBucket& bucket) const {
  Plan plan;
  size_t p_total = 0, q_total = 0, flat_total = 0;
  for (const BucketParam& p : bucket_params(bucket)) {
    Entry e;
    e.param = p;
    if (p.shape.size() >= 2 && p.numel() > 0) {
      e.n = p.shape[0];
      e.m = p.numel() / e.n;
      e.r = std::min<int64_t>({options_.rank, e.n, e.m});
      e.compressed = options_.compress_all || e.r * (e.n + e.m) < e.n * e.m;
    }
    if (e.compressed) {
      e.p_offset = p_total;
      e.q_offset = q_total;
      p_total += static_cast<size_t>(e.n * e.r);
      q_total += static_cast<size_t>(e.m * e.r);
    } else {
      e.p_offset = flat_total;
      flat_total += static_cast<size_t>(p.numel());
    }
    plan.entries.push_back(std::move(e));
  }
  // Uncompressed values first, then the P factors.
  for (Entry& e : plan.entries)
    if (e.compressed) e.p_offset += flat_total;
  plan.phase1_size = flat_total + p_total;
  plan.phase2_size = q_total;
  return plan;
}

PowerSGDHook::MatrixState& PowerSGDHook::state_for(const Entry& e) {
  MatrixState& s = state_[e.param.name];
  if (s.q.defined()) {
    MT_CHECK(s.q.numel() == e.m * e.r, "PowerSGD state for '", e.param.name, "' has Q of ",
             s.q.numel(), " elements, expected ", e.m, " x ", e.r);
  } else {
    s.q = Tensor::empty({e.m, e.r});
    Generator g(options_.seed ^ fnv1a(e.param.name));
    float* q = s.q.data<float>();
    for (int64_t i = 0; i < e.m * e.r; ++i) q[i] = static_cast<float>(g.normal());
  }
  if (s.residual.defined()) {
    MT_CHECK(s.residual.numel() == e.n * e.m, "PowerSGD residual for '", e.param.name, "' has ",
             s.residual.numel(), " elements, expected ", e.n * e.m);
  } else {
    s.residual = Tensor::zeros(e.param.shape);
  }
  return s;
}

size_t PowerSGDHook::wire_bytes(const GradBucket& bucket) const {
  const size_t i = static_cast<size_t>(bucket.index);
  if (i < plans_.size() && plans_[i].dense) return static_cast<size_t>(bucket.buffer.numel()) * 4;
  const Plan plan = make_plan(bucket);
  return (plan.phase1_size + plan.phase2_size) * sizeof(float);
}

comm::WorkPtr PowerSGDHook::launch(GradBucket& bucket, comm::ProcessGroup& pg) {
  if (plans_.size() <= static_cast<size_t>(bucket.index)) plans_.resize(bucket.index + 1);
  Plan& plan = plans_[static_cast<size_t>(bucket.index)];
  const int64_t launches = std::max(plan.launches, steps_loaded_) + 1;
  std::vector<float> phase1 = std::move(plan.phase1), phase2 = std::move(plan.phase2);
  plan = make_plan(bucket);  // the layout may have changed (bucket rebuild)
  plan.launches = launches;
  plan.phase1 = std::move(phase1);  // keeps the capacity from step to step
  plan.phase2 = std::move(phase2);
  pg_ = &pg;
  // Warm-up: the first steps go uncompressed, without error feedback, as in PyTorch.
  plan.dense = launches <= options_.warmup_steps;
  if (plan.dense)
    return pg.all_reduce(bucket.buffer.data_ptr(), static_cast<size_t>(bucket.buffer.numel()),
                         DType::f32);
  plan.phase1.resize(plan.phase1_size);
  plan.phase2.resize(plan.phase2_size);
  float* b = bucket.buffer.data<float>();
  for (const Entry& e : plan.entries) {
    float* M = b + e.param.offset;
    if (!e.compressed) {
      std::memcpy(plan.phase1.data() + e.p_offset, M,
                  static_cast<size_t>(e.param.numel()) * sizeof(float));
      continue;
    }
    MatrixState& s = state_for(e);
    const float* res = s.residual.data<float>();
    for (int64_t i = 0; i < e.n * e.m; ++i) M[i] += res[i];
    matmul_mq(M, s.q.data<float>(), plan.phase1.data() + e.p_offset, e.n, e.m, e.r);
  }
  return pg.all_reduce(plan.phase1.data(), plan.phase1.size(), DType::f32);
}

void PowerSGDHook::finish(GradBucket& bucket) {
  Plan& plan = plans_.at(static_cast<size_t>(bucket.index));
  if (plan.dense) return;
  float* b = bucket.buffer.data<float>();
  bool any_compressed = false;
  for (const Entry& e : plan.entries) {
    float* M = b + e.param.offset;
    if (!e.compressed) {
      std::memcpy(M, plan.phase1.data() + e.p_offset,
                  static_cast<size_t>(e.param.numel()) * sizeof(float));
      continue;
    }
    any_compressed = true;
    float* P = plan.phase1.data() + e.p_offset;
    float* Q = plan.phase2.data() + e.q_offset;
    orthonormalise(P, e.n, e.r, options_.seed ^ fnv1a(e.param.name));
    matmul_mtp(M, P, Q, e.n, e.m, e.r);
    // This rank's residual: M minus its own projection P P^T M = P Q_local^T. Summed over
    // ranks, the residuals are exactly what the reduced P Q^T leaves out.
    MatrixState& s = state_[e.param.name];
    float* res = s.residual.data<float>();
    std::memcpy(res, M, static_cast<size_t>(e.n * e.m) * sizeof(float));
    outer(P, Q, res, e.n, e.m, e.r, /*subtract=*/true);
  }
  if (!any_compressed) return;
  MT_CHECK(pg_ != nullptr, "PowerSGD finish without launch");
  pg_->all_reduce(plan.phase2.data(), plan.phase2.size(), DType::f32)->wait();
  for (const Entry& e : plan.entries) {
    if (!e.compressed) continue;
    const float* P = plan.phase1.data() + e.p_offset;
    const float* Q = plan.phase2.data() + e.q_offset;
    outer(P, Q, b + e.param.offset, e.n, e.m, e.r, /*subtract=*/false);
    MatrixState& s = state_[e.param.name];
    std::memcpy(s.q.data<float>(), Q, static_cast<size_t>(e.m * e.r) * sizeof(float));
  }
}

nn::NamedTensors PowerSGDHook::state_dict() const {
  nn::NamedTensors out;
  int64_t steps = steps_loaded_;
  for (const Plan& p : plans_) steps = std::max(steps, p.launches);
  Tensor t = Tensor::zeros({1}, DType::i64);
  t.data<int64_t>()[0] = steps;
  out.emplace_back("steps", t);
  for (const auto& [name, s] : state_) {
    out.emplace_back("q." + name, s.q.clone());
    out.emplace_back("residual." + name, s.residual.clone());
  }
  return out;
}

void PowerSGDHook::load_state_dict(const nn::NamedTensors& state) {
  std::map<std::string, MatrixState> loaded;
  int64_t steps = 0;
  for (const auto& [key, t] : state) {
    if (key == "steps") {
      if (t.dtype() != DType::i64 || t.numel() != 1)
        MT_THROW(ValueError, "PowerSGD hook state: 'steps' must be one i64");
      steps = t.data<int64_t>()[0];
      continue;
    }
    if (t.dtype() != DType::f32)
      MT_THROW(ValueError, "PowerSGD hook state: '", key, "' is ", dtype_name(t.dtype()),
               ", expected f32");
    if (key.rfind("q.", 0) == 0) {
      loaded[key.substr(2)].q = t.clone();
    } else if (key.rfind("residual.", 0) == 0) {
      loaded[key.substr(9)].residual = t.clone();
    } else {
      MT_THROW(ValueError, "PowerSGD hook state: unexpected entry '", key, "'");
    }
  }
  for (const auto& [name, s] : loaded)
    if (!s.q.defined() || !s.residual.defined())
      MT_THROW(ValueError, "PowerSGD hook state: '", name, "' needs both q and residual");
  state_ = std::move(loaded);
  steps_loaded_ = steps;
  plans_.clear();
}

}  // namespace meshtrain::parallel
