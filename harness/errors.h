// Error text for people: LibTorch's c10::Error carries a C++ backtrace in what(), which
// buries the message; this keeps the message alone.
#pragma once

#include <c10/util/Exception.h>

#include <exception>
#include <string>

namespace pipecheck::harness {

inline std::string ErrorMessage(const std::exception& error) {
  if (const auto* torch_error = dynamic_cast<const c10::Error*>(&error)) return torch_error->what_without_backtrace();
  return error.what();
}

}  // namespace pipecheck::harness
