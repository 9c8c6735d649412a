// Row-wise kernels' parallel loop, shared by the one-pass kernels (rotary.h, rms_norm.h,
// score_softmax.h).
#pragma once

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>

namespace pipecheck::reference {

// Calls row(r) for every r in [0, rows), rows of `length` elements, in parallel as ATen's
// elementwise kernels split their work (the same grain in elements; a row is never split).
template <typename Row>
void ParallelRows(int64_t rows, int64_t length, const Row& row) {
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / std::max<int64_t>(length, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) row(r);
  });
}

}  // namespace pipecheck::reference
