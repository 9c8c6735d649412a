// Fingerprints of the tensors that cross a pipeline's stage boundaries (an activation going
// forward, a gradient coming back), small enough to record for every microbatch of every step
// and precise enough to say which tensor went wrong first: sum, norm, largest magnitude, a
// row-order-sensitive weighted sum and, where the bytes are on the host anyway, a hash of them.
// Shared by the pipeline (what its ranks sent and received) and the harness (the same boundary
// cut out of the reference). Not a comparison of whole tensors: gradients and weights are
// judged whole elsewhere (harness/parity.h).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <string>

namespace pipecheck::reference {

struct Fingerprint {
  double sum = 0.0;
  double norm = 0.0;
  double max_abs = 0.0;
  double row_weighted_sum = 0.0;  // sum over rows r of (r + 1) x the row's sum: sees rows swapped
  int64_t numel = 0;
  int64_t rows = 0;
  bool hashed = false;
  uint64_t hash = 0;  // of the tensor's bytes, C order; only when `hashed`
};

// The four numbers of a fingerprint as a float64 tensor (4) on the tensor's own device, computed
// in the tensor's dtype without a temporary of its size (the memory meter must not see one), so a
// caller on a GPU can read many at once instead of waiting for the device each time.
torch::Tensor FingerprintValues(const torch::Tensor& tensor);  // tensor: (rows, ...)

// FNV-1a over the tensor's bytes in C order (a host copy first for a device tensor).
uint64_t BitwiseHash(const torch::Tensor& tensor);

// Whether fingerprints of `tensor` carry a hash: always on the host, where the bytes are at hand,
// and for float64 on a device (float64 runs are the bitwise ones).
bool HashesOnDevice(const torch::Tensor& tensor);

// What a fingerprint knows of `tensor` without reading the device: its size and, where
// HashesOnDevice, its bytes' hash, taken now (before anything can overwrite them).
Fingerprint StartFingerprint(const torch::Tensor& tensor);
// Fills in the four numbers from FingerprintValues' result, read back to the host.
void FillValues(Fingerprint& fingerprint, const torch::Tensor& values);
// All of it at once (one device read).
Fingerprint FingerprintOf(const torch::Tensor& tensor);

// How far `got` is from `want`, relative to want's size: the largest of |d norm| / norm,
// |d max_abs| / norm, |d sum| / (sqrt(numel) norm) and |d row_weighted_sum| / (rows
// sqrt(numel) norm), each against the largest it could be. (The largest magnitude is one
// element, which low precision rounds by a percent; the norm bounds it and averages rounding.) 0 when both are zero;
// infinite when the sizes differ or `got` is not finite.
double FingerprintError(const Fingerprint& got, const Fingerprint& want);

// Whether two fingerprints describe the same bytes: equal hashes where both have one, else
// values equal to within a few roundings of `dtype` (the reductions may run in another order).
bool SameBytes(const Fingerprint& a, const Fingerprint& b, torch::ScalarType dtype);

// "norm 3.1416, sum -0.5, max |x| 1.2"
std::string Describe(const Fingerprint& fingerprint);

}  // namespace pipecheck::reference
