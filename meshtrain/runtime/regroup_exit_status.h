// The exit statuses by which meshtrain's workers tell an elastic meshrun that the job stopped on
// purpose to meet again smaller (elastic.drop_stragglers, straggler_watch.h): every rank
// checkpointed the same step and exited. The agents of the nodes that stay open the next round
// and resume from that checkpoint; the agent of the node left out leaves the job (exit 0) and
// does not rejoin. Any other non-zero status is a failure.
#pragma once

namespace meshtrain::runtime {

// This worker's node stays: meet again without the node left out.
inline constexpr int kRegroupExitStatus = 75;
// This worker's node is the one left out: its agent leaves the job.
inline constexpr int kLeftOutExitStatus = 76;

}  // namespace meshtrain::runtime
