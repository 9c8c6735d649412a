// pipecheck's subcommands, one file each in harness/cli/: each adds its parser to the app and
// returns what runs when it is parsed.
#pragma once

#include "harness/cli/common.h"

namespace pipecheck::cli {

Command AddValidate(CLI::App& app);  // pipecheck validate
Command AddReference(CLI::App& app);  // pipecheck reference
Command AddDump(CLI::App& app);  // pipecheck dump
Command AddRun(CLI::App& app);  // pipecheck run
Command AddWorker(CLI::App& app);  // pipecheck worker
Command AddInvariance(CLI::App& app);  // pipecheck invariance
Command AddSchedule(CLI::App& app);  // pipecheck schedule
Command AddCompare(CLI::App& app);  // pipecheck compare
Command AddBaselineUpdate(CLI::App& app);  // pipecheck baseline update

}  // namespace pipecheck::cli
