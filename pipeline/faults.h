// Named deviations from a correct pipeline, each modelled on a bug real pipeline trainers
// shipped. They are compiled in so pipecheck can prove it catches them, and inert unless a
// scenario's `fault` column names one. Not a fuzzer: each fault is one precise, known bug.
#pragma once

#include <string>
#include <vector>

namespace pipecheck::pipeline {

enum class Fault {
  kNone,
  kDetachInput,             // a stage's received activation is detached before use
  kMeanOfMicrobatchMeans,   // each microbatch's loss divided by its own tokens, then by m
  kGradScalePerMicrobatch,  // accumulated gradients divided by m after every microbatch
  kZeroGradPerMicrobatch,   // gradients zeroed before each microbatch's backward
  kDropMicrobatch,          // the last microbatch's backward skipped (zeros sent on)
  kLocalClip,               // each rank clips by its own norm
  kTiedNormTwice,           // the tied weight counted on both owners in the global norm
  kSkipTiedSync,            // tied gradients not summed between their owners
  kStaleShape,              // receive buffers sized from the first microbatch, reused
  kOptimizerStateReset,     // the optimizer rebuilt at every step
  kSendBeforeRecv,          // blocking sends issued before the matching receives are posted
  kCrashRank,               // the last rank aborts in the middle of step 1 (0 if only one step)
  kHangRank,                // the last rank stops making progress in the middle of step 1 (likewise)
  kClipBeforeTiedSync,      // the clipping norm computed before the tied gradients are summed
  kDoubleGradScaling,       // gradients divided by m at step end on top of the whole-batch normalisation
  kSendBufferReuse,         // an activation's send buffer overwritten before its send completed
};

// Names as the scenario column spells them, "none" first.
const std::vector<std::string>& FaultNames();

// Throws std::invalid_argument for unknown names.
Fault ParseFault(const std::string& name);

}  // namespace pipecheck::pipeline
