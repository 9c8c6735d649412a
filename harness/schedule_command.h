// `pipecheck schedule`: a schedule's per-rank actions, its timeline and bubble under a cost
// model, peak in-flight microbatches, the data-parallel all-reduce, the published makespan, and
// the schedule as PyTorch pipelining's CSV.
#pragma once

#include <ostream>
#include <string>

namespace pipecheck::harness {

struct ScheduleOptions {
  std::string schedule = "1f1b";
  std::string csv;  // also write the schedule here ("" not)
  std::string csv_format = "compute_only";
  int stages = 2;
  int microbatches = 4;
  int virtual_stages = 1;
  bool virtual_given = false;
  bool stages_given = false, microbatches_given = false;  // else the defaults, said in the header
  double backward_cost = 2.0;
  bool recompute = false;     // every B and I runs its stage's forward again first
  int data_parallel = 1;      // replicas, each rank's gradients averaged after its last backward
  double allreduce_cost = 1.0;
  int accumulation = 1;       // rounds of the schedule per optimizer step
};

// Prints it all to `out`; 0. Throws ScheduleError for a schedule that cannot run on the shape.
int PrintSchedule(ScheduleOptions options, std::ostream& out);

}  // namespace pipecheck::harness
