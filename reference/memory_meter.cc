// Tensor memory metering through c10's memory-reporting hook (see memory_meter.h).
#include "reference/memory_meter.h"

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <torch/csrc/profiler/orchestration/observer.h>

#include <algorithm>
#include <atomic>
#include <memory>

#include "reference/device.h"
#include "reference/torch_compat.h"

namespace pipecheck::reference {
namespace {

// c10 reports every allocation to whatever sits in the thread's PROFILER_STATE slot, and PyTorch's
// profiler code reads that same slot as a ProfilerStateBase (profilerEnabled(), record_function,
// FSDP's and DTensor's autograd functions). So the counter is one: a profiler state that is
// disabled (nothing is profiled, profilerEnabled() is false) and only counts bytes. A plain
// MemoryReportingInfoBase there is read as a profiler's state and its fields as garbage
// (std::bad_array_new_length from FSDP's post-backward hook, measured with TorchTitan).
class Counter : public torch::profiler::impl::ProfilerStateBase {
 public:
  Counter() : ProfilerStateBase(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::Disabled)) {}
  torch::profiler::impl::ActiveProfilerType profilerType() override {
    return torch::profiler::impl::ActiveProfilerType::NONE;
  }
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

namespace {

// Whether the step's bytes are counted: always on a GPU, on the CPU once the meter runs.
bool Metered(c10::Device device) { return device.is_cuda() || MemoryMeterActive(); }

}  // namespace

int64_t HeldTensorBytes(c10::Device device) {
  return device.is_cuda() ? DeviceAllocatedBytes(device) : LiveTensorBytes();
}

StepWindow::StepWindow(int64_t baseline_bytes, c10::Device device)
    : baseline_(baseline_bytes), device_(device), started_(Clock::now()) {
  ResetPeak();
}

int64_t StepWindow::PeakSinceReset() const {
  return device_.is_cuda() ? DevicePeakAllocatedBytes(device_) : PeakTensorBytes();
}

void StepWindow::ResetPeak() {
  if (device_.is_cuda()) {
    ResetDevicePeak(device_);
  } else {
    ResetPeakTensorBytes();
  }
}

int64_t StepWindow::FoldPeak() {
  const int64_t peak = PeakSinceReset() - baseline_;
  peak_ = std::max(peak_, peak);
  return peak;
}

void StepWindow::PauseForCopies() {
  Synchronize(device_);
  FoldPeak();
  pause_start_ = Clock::now();
}

void StepWindow::ResumeAfterCopies() {
  Synchronize(device_);
  paused_ += Clock::now() - pause_start_;
  ResetPeak();
}

int64_t StepWindow::PeakSinceLastCall() {
  if (!Metered(device_)) return -1;
  const int64_t peak = FoldPeak();
  ResetPeak();
  return peak;
}

int64_t StepWindow::HeldBytes() const { return Metered(device_) ? HeldTensorBytes(device_) - baseline_ : -1; }

double StepWindow::ElapsedMs() const {
  return std::chrono::duration<double, std::milli>(Clock::now() - started_ - paused_).count();
}

StepWindow::Measured StepWindow::End() {
  Synchronize(device_);  // a GPU step ends when its work has, not when the host has queued it
  Measured measured;
  measured.step_ms = ElapsedMs();
  if (Metered(device_)) {
    FoldPeak();
    measured.peak_bytes = peak_;
  }
  return measured;
}

}  // namespace pipecheck::reference
