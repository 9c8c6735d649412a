// The communication check: each rank's record of the messages it posted (comm_record.h) against
// the plan, step by step, in order. The first mismatch of a step names the rank, the message's
// place in that rank's order and what kind of mismatch it is (extra, missing, out of order,
// mis-shaped): a message sent twice and drained by its receiver leaves every number right, so
// parity alone cannot see it. Not a judge of message contents: boundaries.h judges those.
#pragma once

#include <string>
#include <vector>

#include "pipeline/rank_result.h"
#include "pipeline/schedule.h"
#include "pipeline/stage.h"
#include "reports/report.h"

namespace pipecheck::harness {

struct CommInput {
  const std::string& scenario;
  const pipeline::PipelineConfig& config;
  const pipeline::Schedule& schedule;            // the lowered schedule the ranks ran
  const std::vector<pipeline::RankResult>& ranks;
};

struct CommVerdict {
  std::vector<reports::CommRow> rows;   // comm.csv's rows
  std::vector<std::string> first_problem;       // per step: the first mismatch; empty where none
};

CommVerdict CheckCommunication(const CommInput& input);

// The data-parallel collectives (pipeline x data parallel): each rank of every replica performs
// exactly one all-reduce a step, of every gradient element it holds (its final weights' count),
// and issues it only after its last backward of the step (B or W) has ended. Rows go to comm.csv
// as op "allreduce"; the first problem of a step names the replica, rank and stage.
struct CollectiveInput {
  const std::string& scenario;
  const std::vector<pipeline::RankResult>& ranks;  // every replica's
  size_t steps;
};
CommVerdict CheckCollectives(const CollectiveInput& input);

}  // namespace pipecheck::harness
