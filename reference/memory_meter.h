// Tensor memory as LibTorch's CPU allocator sees it: every allocation and free made on the
// metering thread is counted (through c10's memory-reporting hook, the one its profiler uses),
// giving live bytes and their peak. Trainers turn it into "peak bytes during a step".
// Not a process RSS probe: only tensor storage counts, and only on the thread that started it.
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>

namespace pipecheck::reference {

// Starts counting on the calling thread (idempotent). Tensors allocated before the start are
// never counted, so call it before building anything that should be.
void StartMemoryMeter();
bool MemoryMeterActive();

int64_t LiveTensorBytes();  // counted allocations minus counted frees
int64_t PeakTensorBytes();  // highest LiveTensorBytes since the last reset
void ResetPeakTensorBytes();  // peak := live

// Tensor bytes held on `device` now: the meter's count on the CPU, the CUDA caching allocator's
// allocated bytes on a GPU (every tensor of the process on that device).
int64_t HeldTensorBytes(c10::Device device);

// One training step's measurement window, the same for both trainers: the step's wall time and
// the peak tensor bytes the trainer held on its device (its own: bytes held before it existed
// do not count). On a GPU the window ends once the device has finished the step's work, and
// the peak is the CUDA caching allocator's, reset when the window starts. The moment it copies
// gradients out for comparison is cut out of both; the copies themselves live outside the
// counted allocator (reference::RecordedCopy).
class StepWindow {
 public:
  // Starts the window now; `baseline_bytes` is HeldTensorBytes(device) before the trainer existed.
  StepWindow(int64_t baseline_bytes, c10::Device device);
  void PauseForCopies();                                    // before copying gradients out
  void ResumeAfterCopies();
  int64_t HeldBytes() const;  // what the trainer holds now, -1 when the meter is off
  // The most the trainer held since the previous call (or since the window started, or resumed);
  // the next call counts from what it holds now. -1 when the meter is off. For per-action peaks.
  int64_t PeakSinceLastCall();
  double ElapsedMs() const;   // the window's time so far, pauses excluded

  struct Measured {
    double step_ms = 0.0;
    int64_t peak_bytes = -1;  // -1 when the meter is off
  };
  Measured End();

 private:
  using Clock = std::chrono::steady_clock;
  int64_t PeakSinceReset() const;
  int64_t FoldPeak();  // the trainer's peak since the last reset, kept in peak_ too
  void ResetPeak();

  int64_t baseline_ = 0;
  c10::Device device_;
  int64_t peak_ = 0;
  Clock::time_point started_;
  Clock::duration paused_{0};
  Clock::time_point pause_start_;
};

}  // namespace pipecheck::reference
