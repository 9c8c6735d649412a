// Host memory for measured training: how freed memory is kept, and where recorded copies live.
//
// glibc hands large blocks back to the kernel when they are freed (mmap'd chunks, a trimmed
// heap top); the next step then pays a page fault for every fresh page it writes, ~10% of a
// CPU step here, and more in the microbatches that run first. PyTorch's allocators on GPUs keep
// freed memory cached, and PyTorch's CPU tuning guide swaps in jemalloc or tcmalloc for the same
// reason. A measured process keeps freed memory too, so both trainers are timed on their
// arithmetic rather than on the kernel zeroing pages.
//
// The gradients and weights a trainer records for comparison are kept for the whole run. Made
// with the tensor allocator, they would take the blocks the step just freed and hand the next
// step's activations fresh pages again, so they live in their own mappings, outside the heap the
// step allocates from and outside the memory meter's count.
#pragma once

#include <torch/types.h>

namespace pipecheck::reference {

// Freed host memory stays with the process (no mmap'd chunks, no trimming). Call once, early.
void KeepFreedHostMemory();

// A contiguous host copy of `tensor` (any device) in its own anonymous mapping.
torch::Tensor RecordedCopy(const torch::Tensor& tensor);

}  // namespace pipecheck::reference
