// What the trainers need of a device beyond tensors: waiting for it, the memory its allocator
// holds, and timing on its own clock. On the CPU these are the host's clock and the tensor
// memory meter (memory_meter.h). On a CUDA device (builds against a CUDA LibTorch, where
// PIPECHECK_CUDA is 1) they are stream synchronisation, the CUDA caching allocator's statistics
// (allocated bytes, the figure torch.cuda.max_memory_allocated reports) and CUDA events recorded
// on the current stream, so timing a GPU action needs no host synchronisation inside a step.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

namespace pipecheck::reference {

// Whether this build can drive CUDA devices (its LibTorch has CUDA); says nothing of the machine.
bool BuiltWithCuda();
// CUDA devices this process sees (0 without CUDA, or in a CPU build).
int CudaDeviceCount();

// Makes `device` the current CUDA device of this thread (no-op on CPU), as torchrun's ranks do.
void MakeCurrent(torch::Device device);

// Runs a small matrix product forward and backward on `device` (no-op on CPU), so that what
// libraries allocate once per process and thread (cuBLAS handles and workspaces, for the
// calling thread and autograd's device thread) exists before any trainer takes its baseline:
// otherwise the first trainer's step peaks would include it and later ones' would not.
void WarmUpDevice(torch::Device device);

// Blocks until the device has finished the work queued on its current stream (no-op on CPU).
void Synchronize(torch::Device device);

// `tensor` (on the host) on `device`, with the same values, without making the host wait: to a
// CUDA device through pinned memory, queued on the current stream (a plain .to() from pageable
// memory waits until everything queued before it has run: one stall per microbatch, where the
// executor moves each microbatch's tokens, labels and tables). Elsewhere tensor.to(device).
torch::Tensor ToDevice(const torch::Tensor& tensor, torch::Device device);

// While one is alive and active, any operation that makes the host wait for a CUDA device (a
// blocking copy, .item(), a stream synchronisation) throws: LibTorch's sync debug mode, as
// torch.cuda.set_sync_debug_mode("error"). For checking that work which should only queue on the
// device does so. Not active on the CPU or in builds without CUDA; not nestable across threads.
class HostSyncCheck {
 public:
  HostSyncCheck(bool active, torch::Device device);
  ~HostSyncCheck();
  HostSyncCheck(const HostSyncCheck&) = delete;
  HostSyncCheck& operator=(const HostSyncCheck&) = delete;

 private:
  int previous_ = -1;  // the mode to restore; -1 when this check did not set one
};

// The device allocator's view of one device: bytes held by live tensors now, and their peak
// since the last ResetDevicePeak. Only for CUDA devices.
int64_t DeviceAllocatedBytes(torch::Device device);
int64_t DevicePeakAllocatedBytes(torch::Device device);
void ResetDevicePeak(torch::Device device);
// A CUDA device's whole memory (cudaGetDeviceProperties: no context is created). Throws in a
// build without CUDA.
int64_t DeviceTotalBytes(int index);

// Marks on one device's clock, read once the device has passed them all: on the CPU the host's
// steady clock, on CUDA timing events recorded on the current stream. Mark() never waits;
// Microseconds() waits for the device once (the first call after new marks) and gives a
// mark's time after mark 0. Reusable: Clear() forgets the marks and keeps the events.
class DeviceClock {
 public:
  explicit DeviceClock(torch::Device device);
  ~DeviceClock();
  DeviceClock(const DeviceClock&) = delete;
  DeviceClock& operator=(const DeviceClock&) = delete;

  int Mark();
  double Microseconds(int mark);
  void Clear();
  bool on_device() const { return device_.is_cuda(); }

 private:
  struct Events;  // the CUDA events; null on the CPU
  torch::Device device_;
  std::vector<std::chrono::steady_clock::time_point> host_marks_;
  std::unique_ptr<Events> events_;
  int marks_ = 0;
  bool waited_ = false;
};

}  // namespace pipecheck::reference
