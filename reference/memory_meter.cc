// Tensor memory metering through c10's memory-reporting hook (see memory_meter.h).
#include "reference/memory_meter.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "reference/torch_compat.h"

namespace pipecheck::reference {
namespace {

class Counter : public c10::MemoryReportingInfoBase {
 public:
  void reportMemoryUsage(void* /*ptr*/, int64_t alloc_size, compat::MemoryTotal /*total_allocated*/,
                         compat::MemoryTotal /*total_reserved*/, c10::Device device) override {
    if (!device.is_cpu()) return;
    const int64_t now = live_.fetch_add(alloc_size) + alloc_size;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }

  std::atomic<int64_t> live_{0};
  std::atomic<int64_t> peak_{0};
};

std::shared_ptr<Counter>& TheCounter() {
  static std::shared_ptr<Counter> counter;
  return counter;
}

}  // namespace

void StartMemoryMeter() {
  if (TheCounter()) return;
  TheCounter() = std::make_shared<Counter>();
  // Installed for the rest of the process on this thread: the guard is never destroyed.
  static auto* guard = new c10::DebugInfoGuard(c10::DebugInfoKind::PROFILER_STATE, TheCounter());
  (void)guard;
}

bool MemoryMeterActive() { return static_cast<bool>(TheCounter()); }

int64_t LiveTensorBytes() { return TheCounter() ? TheCounter()->live_.load() : 0; }

int64_t PeakTensorBytes() { return TheCounter() ? TheCounter()->peak_.load() : 0; }

void ResetPeakTensorBytes() {
  if (TheCounter()) TheCounter()->peak_.store(TheCounter()->live_.load());
}

StepWindow::StepWindow(int64_t baseline_bytes) : baseline_(baseline_bytes), started_(Clock::now()) {
  ResetPeakTensorBytes();
}

void StepWindow::PauseForCopies() {
  peak_ = std::max(peak_, PeakTensorBytes() - baseline_);
  pause_start_ = Clock::now();
}

void StepWindow::ResumeAfterCopies() {
  paused_ += Clock::now() - pause_start_;
  ResetPeakTensorBytes();
}

int64_t StepWindow::HeldBytes() const { return MemoryMeterActive() ? LiveTensorBytes() - baseline_ : -1; }

double StepWindow::ElapsedMs() const {
  return std::chrono::duration<double, std::milli>(Clock::now() - started_ - paused_).count();
}

StepWindow::Measured StepWindow::End() {
  Measured measured;
  measured.step_ms = ElapsedMs();
  if (MemoryMeterActive()) measured.peak_bytes = std::max(peak_, PeakTensorBytes() - baseline_);
  return measured;
}

}  // namespace pipecheck::reference
