// Schedules as files: PyTorch pipelining's compute-only CSV, read and written, and the
// `csv:PATH` schedule names that refer to one.
#pragma once

#include <string>

#include "pipeline/schedule.h"

namespace pipecheck::pipeline {

// PyTorch pipelining's compute-only CSV (`_dump_csv` / `_load_csv`): one row per rank, one
// action per cell (`0F0`, `1B3`, `0I1`, `0W1`). Writing keeps compute actions only.
std::string ScheduleToCsv(const Schedule& schedule);

// Reads such a CSV for `shape` (rows must be exactly its ranks), including what PyTorch's own
// schedules put in their `pipeline_order`: DualPipeV's `(0F3;3B1)OVERLAP_F_B` runs as its two
// sub-actions in the order written, and `2REDUCE_GRAD` (stage 2's gradients are final) runs
// nothing but must follow every backward of its stage. Every error names `file`, the row and
// cell (1-based) and the rule broken: an unparseable cell, a communication action, a stage
// outside the shape or on another rank, a microbatch outside the shape, work repeated or missing,
// a backward after its stage's REDUCE_GRAD. Dependencies and deadlocks are the simulator's to find.
Schedule ScheduleFromCsv(const std::string& text, const std::string& file, const PipelineShape& shape);

// The schedule a scenario names: a generator's name, or "csv:PATH" read from PATH.
Schedule ScheduleByName(const std::string& name, const PipelineShape& shape);

}  // namespace pipecheck::pipeline
