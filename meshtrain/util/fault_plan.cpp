// See fault_plan.h.
#include "meshtrain/util/fault_plan.h"

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

#include "meshtrain/util/env_registry.h"
#include "meshtrain/util/error.h"

namespace meshtrain {
namespace {

bool parse_int(std::string_view text, int64_t& out) {
  const char* end = text.data() + text.size();
  auto [p, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc() && p == end && !text.empty();
}

bool parse_double(std::string_view text, double& out) {
  const std::string copy(text);
  char* end = nullptr;
  out = std::strtod(copy.c_str(), &end);
  return !copy.empty() && end == copy.c_str() + copy.size();
}

[[noreturn]] void malformed(Env id, const std::string& value, std::string_view expected) {
  MT_THROW(ValueError, "environment variable ", env_name(id), "='", value, "' is not ", expected);
}

std::optional<int64_t> step_of(Env id, const std::optional<std::string>& v) {
  if (!v) return std::nullopt;
  int64_t step = 0;
  if (!parse_int(*v, step)) malformed(id, *v, "a step number");
  return step;
}

}  // namespace

FaultPlan FaultPlan::parse(
    const std::function<std::optional<std::string>(const std::string&)>& get) {
  auto value = [&](Env id) -> std::optional<std::string> {
    auto v = get(std::string(env_name(id)));
    if (v && v->empty()) return std::nullopt;  // set but empty counts as unset
    return v;
  };
  FaultPlan plan;
  plan.crash_at_step = step_of(Env::test_crash_at_step, value(Env::test_crash_at_step));
  plan.spike_step = step_of(Env::test_spike_step, value(Env::test_spike_step));
  plan.ckpt_stall_at_step =
      step_of(Env::test_ckpt_stall_at_step, value(Env::test_ckpt_stall_at_step));
  if (auto ms = value(Env::test_ckpt_snapshot_delay_ms)) {
    int64_t n = 0;
    if (!parse_int(*ms, n) || n < 0)
      malformed(Env::test_ckpt_snapshot_delay_ms, *ms, "a number of milliseconds");
    plan.ckpt_snapshot_delay = std::chrono::milliseconds(n);
  }
  if (auto spec = value(Env::test_nan_steps)) {
    std::string_view rest = *spec;
    if (rest.ends_with(",always")) {
      plan.nan_always = true;
      rest.remove_suffix(7);
    }
    const size_t dash = rest.find('-');
    int64_t first = 0, last = 0;
    if (!parse_int(rest.substr(0, dash), first) ||
        !parse_int(dash == std::string_view::npos ? rest : rest.substr(dash + 1), last) ||
        last < first)
      malformed(Env::test_nan_steps, *spec, "STEP, FIRST-LAST or either with ,always");
    plan.nan_first = first;
    plan.nan_last = last;
  }
  if (auto spec = value(Env::test_slowdown)) {
    std::string_view text = *spec;
    bool ok = true;
    if (const size_t tilde = text.find('~'); tilde != std::string_view::npos) {
      ok = parse_double(text.substr(tilde + 1), plan.slowdown_probability) &&
           plan.slowdown_probability > 0.0 && plan.slowdown_probability <= 1.0;
      text = text.substr(0, tilde);
    }
    const size_t at = text.find('@');
    int64_t rank = 0;
    ok = ok && parse_double(text.substr(0, at), plan.slowdown) && plan.slowdown >= 1.0 &&
         (at == std::string_view::npos || (parse_int(text.substr(at + 1), rank) && rank >= 0));
    if (!ok)
      malformed(Env::test_slowdown, *spec,
                "F[@RANK][~P] with a factor F >= 1 and a probability 0 < P <= 1");
    if (at != std::string_view::npos) plan.slowdown_rank = rank;
  }
  if (auto restart = get("TORCHELASTIC_RESTART_COUNT"))
    plan.restarted = std::atoi(restart->c_str()) != 0;
  return plan;
}

FaultPlan FaultPlan::from_env() {
  return parse([](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  });
}

bool FaultPlan::crash_now(int64_t step, int rank, int world) const {
  return crash_at_step == step && !restarted && rank == (world > 1 ? 1 : 0);
}

bool FaultPlan::nan_now(int64_t step, int rank, int world, int64_t rollbacks) const {
  if (!nan_first || rank != world - 1) return false;
  return step >= *nan_first && step <= *nan_last && (nan_always || rollbacks == 0);
}

float FaultPlan::loss_scale_now(int64_t step, int rank, int world) const {
  return spike_step == step && rank == world - 1 ? 1000.0f : 1.0f;
}

bool FaultPlan::ckpt_stall_now(int64_t step) const {
  return ckpt_stall_at_step == step && !restarted;
}

std::chrono::duration<double> FaultPlan::slowdown_after(double step_s, int rank,
                                                        int64_t step) const {
  if (slowdown <= 1.0 || (slowdown_rank && *slowdown_rank != rank))
    return std::chrono::duration<double>(0);
  if (slowdown_probability < 1.0) {
    // splitmix64 of (rank, step): a fixed draw per rank and step, independent across ranks.
    uint64_t z = (static_cast<uint64_t>(rank) << 40) ^ static_cast<uint64_t>(step);
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const double u = static_cast<double>(z >> 11) * 0x1.0p-53;
    if (u >= slowdown_probability) return std::chrono::duration<double>(0);
  }
  return std::chrono::duration<double>((slowdown - 1.0) * step_s);
}

}  // namespace meshtrain
