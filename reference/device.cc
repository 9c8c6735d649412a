// Device synchronisation, allocator statistics and clocks (see device.h).
#include "reference/device.h"

#if PIPECHECK_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <torch/cuda.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace pipecheck::reference {

#if PIPECHECK_CUDA

bool BuiltWithCuda() { return true; }

int CudaDeviceCount() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

void MakeCurrent(torch::Device device) {
  if (device.is_cuda() && device.has_index()) c10::cuda::set_device(device.index());
}

void WarmUpDevice(torch::Device device) {
  if (!device.is_cuda()) return;
  for (auto dtype : {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    auto a = torch::ones({64, 64}, torch::TensorOptions().dtype(dtype).device(device).requires_grad(true));
    torch::matmul(a, a).sum().backward();
  }
  Synchronize(device);
}

void Synchronize(torch::Device device) {
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
}

torch::Tensor ToDevice(const torch::Tensor& tensor, torch::Device device) {
  if (!device.is_cuda() || !tensor.device().is_cpu()) return tensor.to(device);
  // Contiguous first: a strided pinned source would be copied again, into pageable memory.
  return tensor.contiguous().pin_memory().to(device, /*non_blocking=*/true);
}

HostSyncCheck::HostSyncCheck(bool active, torch::Device device) {
  if (!active || !device.is_cuda()) return;
  auto& state = c10::cuda::warning_state();
  previous_ = static_cast<int>(state.get_sync_debug_mode());
  state.set_sync_debug_mode(c10::cuda::SyncDebugMode::L_ERROR);
}

HostSyncCheck::~HostSyncCheck() {
  if (previous_ >= 0) c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(previous_));
}

namespace {

// Index 0 of a statistic array is the aggregate over the allocator's pools in every LibTorch
// version (StatType::AGGREGATE, whose namespace moved between versions).
constexpr size_t kAllPools = 0;

// The device's index, with CUDA (and so its caching allocator) initialised: LibTorch does that
// lazily, on the first CUDA tensor, and the allocator's statistics refuse a device before it.
c10::DeviceIndex CudaIndex(torch::Device device) {
  TORCH_CHECK(device.is_cuda(), "device memory statistics are for CUDA devices, not ", device.str());
  static const bool initialised = [] {
    (void)torch::empty({1}, torch::TensorOptions().device(torch::kCUDA));
    return true;
  }();
  (void)initialised;
  return device.has_index() ? device.index() : c10::cuda::current_device();
}

}  // namespace

int64_t DeviceAllocatedBytes(torch::Device device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device)).allocated_bytes[kAllPools].current;
}

int64_t DevicePeakAllocatedBytes(torch::Device device) {
  return c10::cuda::CUDACachingAllocator::getDeviceStats(CudaIndex(device)).allocated_bytes[kAllPools].peak;
}

void ResetDevicePeak(torch::Device device) { c10::cuda::CUDACachingAllocator::resetPeakStats(CudaIndex(device)); }

int64_t DeviceTotalBytes(int index) {
  cudaDeviceProp properties{};
  const cudaError_t status = cudaGetDeviceProperties(&properties, index);
  TORCH_CHECK(status == cudaSuccess, "cannot read cuda:", index, "'s properties: ", cudaGetErrorString(status));
  return static_cast<int64_t>(properties.totalGlobalMem);
}

struct DeviceClock::Events {
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> events;  // timing enabled, reused
};

DeviceClock::DeviceClock(torch::Device device) : device_(device) {
  if (device_.is_cuda()) events_ = std::make_unique<Events>();
}

int DeviceClock::Mark() {
  waited_ = false;
  if (!events_) {
    host_marks_.push_back(std::chrono::steady_clock::now());
    return marks_++;
  }
  if (static_cast<size_t>(marks_) == events_->events.size()) {
    events_->events.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
  }
  events_->events[marks_]->record(c10::cuda::getCurrentCUDAStream(device_.index()));
  return marks_++;
}

double DeviceClock::Microseconds(int mark) {
  TORCH_CHECK(mark >= 0 && mark < marks_, "no clock mark ", mark, " (", marks_, " marks)");
  if (!events_) return std::chrono::duration<double, std::micro>(host_marks_[mark] - host_marks_[0]).count();
  if (!waited_) {
    events_->events[marks_ - 1]->synchronize();
    waited_ = true;
  }
  return 1000.0 * static_cast<double>(events_->events[0]->elapsed_time(*events_->events[mark]));
}

#else  // a LibTorch without CUDA

bool BuiltWithCuda() { return false; }

int CudaDeviceCount() { return 0; }

void MakeCurrent(torch::Device /*device*/) {}

void WarmUpDevice(torch::Device /*device*/) {}

void Synchronize(torch::Device /*device*/) {}

torch::Tensor ToDevice(const torch::Tensor& tensor, torch::Device device) { return tensor.to(device); }

HostSyncCheck::HostSyncCheck(bool /*active*/, torch::Device device) {
  TORCH_CHECK(!device.is_cuda(), "this build has no CUDA: no host synchronisation check for ", device.str());
}

HostSyncCheck::~HostSyncCheck() = default;

int64_t DeviceAllocatedBytes(torch::Device device) {
  TORCH_CHECK(false, "this build has no CUDA: no allocator statistics for ", device.str());
}

int64_t DevicePeakAllocatedBytes(torch::Device device) {
  TORCH_CHECK(false, "this build has no CUDA: no allocator statistics for ", device.str());
}

void ResetDevicePeak(torch::Device device) {
  TORCH_CHECK(false, "this build has no CUDA: no allocator statistics for ", device.str());
}

int64_t DeviceTotalBytes(int index) { TORCH_CHECK(false, "this build has no CUDA: no device memory for cuda:", index); }

struct DeviceClock::Events {};

DeviceClock::DeviceClock(torch::Device device) : device_(device) {
  TORCH_CHECK(!device.is_cuda(), "this build has no CUDA: no clock for ", device.str());
}

int DeviceClock::Mark() {
  host_marks_.push_back(std::chrono::steady_clock::now());
  return marks_++;
}

double DeviceClock::Microseconds(int mark) {
  TORCH_CHECK(mark >= 0 && mark < marks_, "no clock mark ", mark, " (", marks_, " marks)");
  return std::chrono::duration<double, std::micro>(host_marks_[mark] - host_marks_[0]).count();
}

#endif

DeviceClock::~DeviceClock() = default;

void DeviceClock::Clear() {
  host_marks_.clear();
  marks_ = 0;
  waited_ = false;
}

}  // namespace pipecheck::reference
