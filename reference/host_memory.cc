// Host memory for measured training (see host_memory.h).
#include "reference/host_memory.h"

#include <malloc.h>
#include <sys/mman.h>

#include <climits>

namespace pipecheck::reference {

void KeepFreedHostMemory() {
  mallopt(M_MMAP_MAX, 0);                  // every block from the heap, none mapped and unmapped
  mallopt(M_TRIM_THRESHOLD, INT_MAX);      // the heap's top is never handed back
}

torch::Tensor RecordedCopy(const torch::Tensor& tensor) {
  const auto source = tensor.detach();
  const size_t bytes = static_cast<size_t>(source.numel()) * source.element_size();
  if (bytes == 0) return torch::empty(source.sizes(), source.options().device(torch::kCPU));
  void* data = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  TORCH_CHECK(data != MAP_FAILED, "cannot map ", bytes, " bytes for a recorded copy");
  auto copy = torch::from_blob(
      data, source.sizes(), [bytes](void* mapped) { munmap(mapped, bytes); },
      torch::TensorOptions().dtype(source.dtype()).device(torch::kCPU));
  copy.copy_(source);
  return copy;
}

}  // namespace pipecheck::reference
