// Boundary-tensor fingerprints (see fingerprint.h).
#include "reference/fingerprint.h"

#include <fmt/format.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace pipecheck::reference {

torch::Tensor FingerprintValues(const torch::Tensor& tensor) {
  torch::NoGradGuard no_grad;
  const auto t = tensor.detach();
  const auto doubles = torch::TensorOptions().dtype(torch::kFloat64).device(t.device());
  if (t.numel() == 0) return torch::zeros({4}, doubles);
  // Full reductions only: each returns a scalar, none a copy of the tensor.
  std::vector<int64_t> inner;
  for (int64_t d = 1; d < t.dim(); ++d) inner.push_back(d);
  const auto rows = (inner.empty() ? t.reshape({-1}) : t.sum(inner)).to(torch::kFloat64);  // (rows)
  const auto weights = torch::arange(1, rows.size(0) + 1, doubles);                          // (rows)
  const auto norm = t.norm().to(torch::kFloat64);
  const auto [low, high] = torch::aminmax(t);
  const auto max_abs = torch::maximum(low.abs(), high.abs()).to(torch::kFloat64);
  return torch::stack({rows.sum(), norm, max_abs, (rows * weights).sum()});
}

uint64_t BitwiseHash(const torch::Tensor& tensor) {
  const auto bytes = tensor.detach().cpu().contiguous();
  const auto* data = static_cast<const unsigned char*>(bytes.data_ptr());
  const size_t size = static_cast<size_t>(bytes.numel()) * bytes.element_size();
  // FNV-1a's constants, eight bytes a round: a message a microbatch stays cheap to hash.
  constexpr uint64_t kPrime = 1099511628211ULL;
  uint64_t hash = 14695981039346656037ULL;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    std::memcpy(&word, data + i, 8);
    hash = (hash ^ word) * kPrime;
  }
  for (; i < size; ++i) hash = (hash ^ data[i]) * kPrime;
  return hash;
}

bool HashesOnDevice(const torch::Tensor& tensor) {
  return !tensor.is_cuda() || tensor.scalar_type() == torch::kFloat64;
}

Fingerprint StartFingerprint(const torch::Tensor& tensor) {
  Fingerprint fingerprint;
  fingerprint.numel = tensor.numel();
  fingerprint.rows = tensor.dim() > 0 ? tensor.size(0) : 1;
  fingerprint.hashed = HashesOnDevice(tensor);
  if (fingerprint.hashed) fingerprint.hash = BitwiseHash(tensor);
  return fingerprint;
}

void FillValues(Fingerprint& fingerprint, const torch::Tensor& values) {
  const auto host = values.to(torch::kCPU, torch::kFloat64).contiguous();
  TORCH_CHECK(host.numel() == 4, "a fingerprint has 4 values, not ", host.numel());
  const double* v = host.data_ptr<double>();
  fingerprint.sum = v[0];
  fingerprint.norm = v[1];
  fingerprint.max_abs = v[2];
  fingerprint.row_weighted_sum = v[3];
}

Fingerprint FingerprintOf(const torch::Tensor& tensor) {
  Fingerprint fingerprint = StartFingerprint(tensor);
  FillValues(fingerprint, FingerprintValues(tensor));
  return fingerprint;
}

double FingerprintError(const Fingerprint& got, const Fingerprint& want) {
  constexpr double kInfinity = std::numeric_limits<double>::infinity();
  if (got.numel != want.numel || got.rows != want.rows) return kInfinity;
  if (!std::isfinite(got.sum) || !std::isfinite(got.norm) || !std::isfinite(got.max_abs) ||
      !std::isfinite(got.row_weighted_sum)) {
    return kInfinity;
  }
  const auto relative = [](double difference, double scale) {
    if (difference == 0.0) return 0.0;
    return scale > 0.0 ? difference / scale : kInfinity;
  };
  const double spread = std::sqrt(static_cast<double>(std::max<int64_t>(want.numel, 1))) * want.norm;
  return std::max({relative(std::abs(got.norm - want.norm), want.norm),
                   relative(std::abs(got.max_abs - want.max_abs), want.norm),
                   relative(std::abs(got.sum - want.sum), spread),
                   relative(std::abs(got.row_weighted_sum - want.row_weighted_sum),
                            static_cast<double>(std::max<int64_t>(want.rows, 1)) * spread)});
}

bool SameBytes(const Fingerprint& a, const Fingerprint& b, torch::ScalarType dtype) {
  if (a.hashed && b.hashed) return a.hash == b.hash && a.numel == b.numel;
  const double epsilon = (dtype == torch::kBFloat16 || dtype == torch::kHalf) ? 1.0 / 256 : dtype == torch::kFloat32 ? 1.2e-7 : 2.3e-16;
  return FingerprintError(a, b) <= 16 * epsilon;
}

std::string Describe(const Fingerprint& fingerprint) {
  return fmt::format("norm {:.6g}, sum {:.6g}, max |x| {:.6g}", fingerprint.norm, fingerprint.sum,
                     fingerprint.max_abs);
}

}  // namespace pipecheck::reference
