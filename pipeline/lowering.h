// Lowering: from a compute-only schedule (F, B, I, W) to the lists ranks run, with every
// receive and send placed. All passes are here and are pure functions of the schedule; which
// message an action sends or takes is message.h's rule, whether the result runs is the
// simulator's to say (simulator.h).
#pragma once

#include <cstdint>
#include <optional>

#include "pipeline/schedule.h"

namespace pipecheck::pipeline {

// Adds the communication: a RECV before each compute whose input comes from another rank, a
// SEND after each compute whose output goes to another rank; then every receive is moved ahead
// of the sends just before it, so a rank always posts its receives before it sends, and ahead
// of the compute action before those, so its message can land during that action (neither
// when `post_receives_first` is false: the send_before_recv fault).
Schedule AddCommunication(const Schedule& schedule, bool post_receives_first = true);

// Receives posted early enough that no rank waits forever in a send: where the schedule
// deadlocks when sends wait for their receives (interleaved schedules do, with each receive
// just before the compute that needs it), the receive a stuck send waits for is moved up to
// where its rank is stuck, one at a time, until the schedule runs. A receive is always safe to
// post earlier (its buffer is known from the plan); what is moved is what the schedule needs,
// so buffers are held no longer than that. Unchanged when nothing deadlocks.
Schedule PostReceivesWhereNeeded(Schedule lowered);

// The transport discipline (transport.h): a rank's receives from one peer are posted in the
// order that peer sends them, since messages are matched by order. Each receive moves earlier
// where needed (never later: a receive may always be posted earlier), so the k-th is posted no
// later than the (k+1)-th; receives posted together keep the sender's order.
Schedule OrderReceivesAsSent(Schedule lowered);

// What every rank runs, on every transport: AddCommunication, PostReceivesWhereNeeded, then
// OrderReceivesAsSent (only AddCommunication when the send_before_recv fault asks for sends
// ahead of receives, a bug the others must not repair).
Schedule LowerSchedule(const Schedule& compute, bool post_receives_first = true);

// LowerSchedule, or none once its deadlock search has simulated more than `budget` actions in
// all: a bound on the work, the same on every machine, for checks that must answer at once
// (validation, the memory pre-check) and may leave a long search to the ranks that run it.
// Schedules that post their receives in order need one simulation; zero-bubble V shapes need
// one for each receive they hoist, so their search grows as the square of their length.
std::optional<Schedule> LowerScheduleWithin(const Schedule& compute, int64_t budget, bool post_receives_first = true);

}  // namespace pipecheck::pipeline
