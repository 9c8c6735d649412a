// Tensor memory as LibTorch's CPU allocator sees it: every allocation and free made on the
// metering thread is counted (through c10's memory-reporting hook, the one its profiler uses),
// giving live bytes and their peak. Trainers turn it into "peak bytes during a step".
// Not a process RSS probe: only tensor storage counts, and only on the thread that started it.
#pragma once

#include <cstdint>

namespace pipecheck::reference {

// Starts counting on the calling thread (idempotent). Tensors allocated before the start are
// never counted, so call it before building anything that should be.
void StartMemoryMeter();
bool MemoryMeterActive();

int64_t LiveTensorBytes();  // counted allocations minus counted frees
int64_t PeakTensorBytes();  // highest LiveTensorBytes since the last reset
void ResetPeakTensorBytes();  // peak := live

// Peak bytes a trainer holds during one step, measured in two windows around the moment it
// copies gradients out for comparison, so that those copies never count: pass the bytes of
// copies already held before and after that moment.
class StepMemory {
 public:
  explicit StepMemory(int64_t baseline_bytes) : baseline_(baseline_bytes) {}
  void BeginStep(int64_t copies_held);    // step start: copies held from earlier steps
  void PauseForCopies();                  // before copying gradients out
  void ResumeAfterCopies(int64_t copies_held);
  int64_t EndStep();                      // peak of the step, -1 when the meter is off

 private:
  int64_t baseline_ = 0;
  int64_t copies_ = 0;
  int64_t peak_ = 0;
};

}  // namespace pipecheck::reference
