// Pipeline schedules, proven on the simulator for every shape up to 8 stages, 16 micro-batches
// and 4 virtual stages: transfers pair up, nothing deadlocks even when sends do not buffer,
// forwards precede backwards, the first stage's live activations stay within the schedule's
// bound, and the simulated bubble equals the closed form.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "meshtrain/parallel/pipeline/schedule.h"
#include "meshtrain/parallel/pipeline/schedule_sim.h"
#include "meshtrain/util/error.h"

namespace meshtrain::parallel::pipeline {
namespace {

constexpr ScheduleKind kKinds[] = {ScheduleKind::gpipe, ScheduleKind::one_f_one_b,
                                   ScheduleKind::interleaved};

// (forward time, backward time, buffered sends): rendezvous is the strict model for deadlocks;
// several cost ratios show the bubble does not depend on backward = 2 x forward.
constexpr std::tuple<int64_t, int64_t, bool> kTimings[] = {
    {1, 2, false}, {1, 2, true}, {1, 1, false}, {2, 3, false}, {1, 3, true}};

bool valid(const PipelineShape& s) {
  try {
    s.validate();
    return true;
  } catch (const ValueError&) {
    return false;
  }
}

std::string name(const PipelineShape& s) {
  return std::string(schedule_kind_name(s.kind)) + " P=" + std::to_string(s.stages) +
         " M=" + std::to_string(s.micro_batches) + " V=" + std::to_string(s.virtual_stages);
}

TEST(PipelineSchedule, EveryShapeIsSoundWithinItsMemoryBoundAndBubble) {
  int shapes = 0;
  for (ScheduleKind kind : kKinds)
    for (int P = 1; P <= 8; ++P)
      for (int M = 1; M <= 16; ++M)
        for (int V = 1; V <= 4; ++V) {
          const PipelineShape s{P, M, V, kind};
          if (!valid(s)) continue;
          ++shapes;
          for (const auto& [fwd, bwd, buffered] : kTimings) {
            SimOptions opt;
            opt.buffered_sends = buffered;
            opt.forward_time = fwd;
            opt.backward_time = bwd;
            const SimResult r = simulate(s, opt);
            const std::string what = name(s) + (buffered ? " buffered" : " rendezvous") +
                                     " F=" + std::to_string(fwd) + " B=" + std::to_string(bwd);
            ASSERT_TRUE(r.completed) << what << ": deadlock: " << r.deadlock;
            ASSERT_TRUE(r.errors.empty()) << what << ": " << r.errors.front();
            // Activations alive on the first stage, counted in (micro-batch, chunk) pairs.
            const int alive = r.peak_alive[0];
            switch (kind) {
              case ScheduleKind::gpipe:
                EXPECT_EQ(alive, M) << what;
                break;
              case ScheduleKind::one_f_one_b:
                EXPECT_EQ(alive, std::min(P, M)) << what;
                break;
              case ScheduleKind::interleaved:
                // Megatron's warm-up plus the one in flight, each a 1/V-th of the stage.
                EXPECT_LE(alive, std::min((P - 1) * 2 + (V - 1) * P + 1, M * V)) << what;
                break;
            }
            // Bubble: a chunk's forward takes F, its backward B. Every rank computes
            // (F + B) M V; the step lasts exactly (F + B) (V M + P - 1), so each rank idles
            // (P - 1) / (V M + P - 1) of it (V = 1: GPipe's and 1F1B's (P - 1) / (M + P - 1)).
            // Compared in integers.
            const int64_t want_makespan = (fwd + bwd) * (int64_t{V} * M + P - 1);
            EXPECT_EQ(r.makespan, want_makespan) << what << "\n" << render_timeline(r);
            for (int p = 0; p < P; ++p)
              EXPECT_EQ(r.busy[static_cast<size_t>(p)], (fwd + bwd) * M * V) << what;
          }
        }
  // GPipe and 1F1B: all 8 x 16 shapes with V = 1; interleaved: P >= 2, M a multiple of P, V >= 2.
  int interleaved = 0;
  for (int P = 2; P <= 8; ++P) interleaved += 3 * (16 / P);
  EXPECT_EQ(shapes, 2 * 8 * 16 + interleaved);
}

TEST(PipelineSchedule, OneFOneBFusesTheSteadyStateTransfers) {
  const PipelineShape s{2, 3, 1, ScheduleKind::one_f_one_b};
  auto program = [&](int p) {
    std::string out;
    for (const Action& a : build_schedule(s, p)) out += describe(a) + " ";
    return out;
  };
  // Stage 0 warms up with one forward, then sends each activation together with the receive of
  // the gradient it waits for next; stage 1 sends each gradient with the next activation's
  // receive. Posted one after the other, both sends would wait for receives never posted.
  EXPECT_EQ(program(0),
            "F0.0 [sa0.0>1] F1.0 [sa1.0>1 rg0.0<1] B0.0 F2.0 [sa2.0>1 rg1.0<1] B1.0 "
            "[rg2.0<1] B2.0 ");
  EXPECT_EQ(program(1),
            "[ra0.0<0] F0.0 B0.0 [sg0.0>0 ra1.0<0] F1.0 B1.0 [sg1.0>0 ra2.0<0] F2.0 B2.0 "
            "[sg2.0>0] ");
}

TEST(PipelineSchedule, SimulatorCatchesUnfusedTransfersAndMissingReceives) {
  const PipelineShape s{4, 8, 1, ScheduleKind::one_f_one_b};
  std::vector<std::vector<Action>> split;
  for (int p = 0; p < s.stages; ++p) {
    split.emplace_back();
    for (const Action& a : build_schedule(s, p)) {
      if (a.type != Action::Type::p2p) {
        split.back().push_back(a);
        continue;
      }
      for (const P2POp& op : a.p2p) {  // each transfer alone, sends first
        Action one;
        one.type = Action::Type::p2p;
        one.p2p = {op};
        split.back().push_back(one);
      }
    }
  }
  const SimResult rendezvous = simulate(s, split);
  EXPECT_FALSE(rendezvous.completed);
  EXPECT_NE(rendezvous.deadlock.find("waits in action"), std::string::npos) << rendezvous.deadlock;
  SimOptions buffered;
  buffered.buffered_sends = true;
  EXPECT_TRUE(simulate(s, split, buffered).sound());

  // Dropping one receive leaves its send unpaired and the forward without its input.
  std::vector<std::vector<Action>> programs;
  for (int p = 0; p < s.stages; ++p) programs.push_back(build_schedule(s, p));
  auto& last = programs[3];
  auto it = std::find_if(last.begin(), last.end(),
                         [](const Action& a) { return a.type == Action::Type::p2p; });
  ASSERT_NE(it, last.end());
  it->p2p.erase(
      std::remove_if(it->p2p.begin(), it->p2p.end(), [](const P2POp& op) { return !op.is_send(); }),
      it->p2p.end());
  const SimResult broken = simulate(s, programs, buffered);
  ASSERT_FALSE(broken.errors.empty());
  bool unpaired = false, early = false;
  for (const std::string& e : broken.errors) {
    unpaired |= e.find("1 sends from rank 2 to rank 3") != std::string::npos;
    early |= e.find("before its input activation arrived") != std::string::npos;
  }
  EXPECT_TRUE(unpaired);
  EXPECT_TRUE(early);
}

void expect_value_error(const PipelineShape& s, const std::string& needle) {
  try {
    s.validate();
    ADD_FAILURE() << name(s) << " was accepted";
  } catch (const ValueError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(PipelineSchedule, BadShapesAreOneLineNamingTheKeys) {
  expect_value_error({4, 6, 2, ScheduleKind::interleaved},
                     "parallel.micro_batches (6) to be a multiple of parallel.pp (4)");
  expect_value_error({4, 8, 2, ScheduleKind::one_f_one_b},
                     "parallel.virtual_stages = 2 needs parallel.schedule = interleaved");
  expect_value_error({4, 8, 1, ScheduleKind::interleaved}, "parallel.virtual_stages >= 2");
  expect_value_error({1, 8, 2, ScheduleKind::interleaved}, "parallel.pp >= 2");
  expect_value_error({0, 8, 1, ScheduleKind::gpipe}, "parallel.pp must be at least 1");
  expect_value_error({2, 0, 1, ScheduleKind::gpipe}, "parallel.micro_batches must be at least 1");
  EXPECT_THROW(parse_schedule_kind("zb"), ValueError);
  EXPECT_EQ(parse_schedule_kind("1f1b"), ScheduleKind::one_f_one_b);
}

}  // namespace
}  // namespace meshtrain::parallel::pipeline
