// Dtypes named as PyTorch and the scenario column name them (float64, bfloat16), where LibTorch's
// own c10::toString says "Double" and "BFloat16": one spelling in every report and message.
#pragma once

#include <torch/types.h>

#include <string>

namespace pipecheck::reference {

inline std::string DtypeName(torch::Dtype dtype) {
  switch (dtype) {
    case torch::kFloat64: return "float64";
    case torch::kFloat32: return "float32";
    case torch::kBFloat16: return "bfloat16";
    case torch::kFloat16: return "float16";
    case torch::kInt64: return "int64";
    case torch::kInt32: return "int32";
    case torch::kUInt8: return "uint8";
    default: return c10::toString(dtype);
  }
}

}  // namespace pipecheck::reference
