// Schedules as files: PyTorch pipelining's compute-only CSV, read and written, and the
// `csv:PATH` schedule names that refer to one.
#pragma once

#include <string>

#include "pipeline/schedule.h"

namespace pipecheck::pipeline {

// PyTorch pipelining's two CSV formats (`_dump_csv` / `_load_csv`): one row per rank, one action
// per cell. compute_only holds the compute actions (`0F0`, `1B3`, `0I1`, `0W1`); compute_comms
// also the communication, in the order each rank runs it (`0SEND_F0`, `1RECV_F0`, `1SEND_B0`,
// `0RECV_B0`: a send named by its sending stage, a receive by its receiving stage, as PyTorch's
// lowering names them), which PyTorch's _PipelineScheduleRuntime then runs as written.
enum class CsvFormat { kComputeOnly, kComputeComms };

// compute_only keeps `schedule`'s compute actions; compute_comms writes every action of a
// lowered schedule (LowerSchedule), so PyTorch's runtime runs pipecheck's own communication plan.
std::string ScheduleToCsv(const Schedule& schedule, CsvFormat format = CsvFormat::kComputeOnly);

// Reads a CSV of either format for `shape` (rows must be exactly its ranks), including what
// PyTorch's own schedules put in their `pipeline_order`: DualPipeV's `(0F3;3B1)OVERLAP_F_B` runs
// as its two sub-actions in the order written, `2REDUCE_GRAD` (stage 2's gradients are final)
// runs nothing but must follow every backward of its stage, and `2WAIT_REDUCE_GRAD` (PyTorch
// 2.15: where that reduction is waited for) runs nothing and must follow it. Communication cells are
// checked (a message between two ranks, of a stage this row's rank holds, a microbatch that
// exists) and left out: pipecheck lowers the compute actions itself. Every error names `file`,
// the row and cell (1-based) and the rule broken: an unparseable cell, a stage outside the shape
// or on another rank, a microbatch outside the shape, a message that never leaves its rank, work
// repeated or missing, a backward after its stage's REDUCE_GRAD. Dependencies and deadlocks are
// the simulator's to find.
Schedule ScheduleFromCsv(const std::string& text, const std::string& file, const PipelineShape& shape);

// The schedule a scenario names: a generator's name, or "csv:PATH" read from PATH.
Schedule ScheduleByName(const std::string& name, const PipelineShape& shape);

}  // namespace pipecheck::pipeline
