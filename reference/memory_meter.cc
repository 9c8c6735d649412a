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

void StepMemory::BeginStep(int64_t copies_held) {
  copies_ = copies_held;
  peak_ = 0;
  ResetPeakTensorBytes();
}

void StepMemory::PauseForCopies() { peak_ = std::max(peak_, PeakTensorBytes() - baseline_ - copies_); }

void StepMemory::ResumeAfterCopies(int64_t copies_held) {
  copies_ = copies_held;
  ResetPeakTensorBytes();
}

int64_t StepMemory::EndStep() {
  if (!MemoryMeterActive()) return -1;
  return std::max(peak_, PeakTensorBytes() - baseline_ - copies_);
}

}  // namespace pipecheck::reference
