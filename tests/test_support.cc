// Test helpers (see test_support.h).
#include "tests/test_support.h"

#include <unistd.h>

#include <filesystem>

namespace pipecheck::testing {

std::string ScratchDirectory(const std::string& name) {
  const auto path = std::filesystem::temp_directory_path() /
                    ("pipecheck_test_" + name + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(path);
  std::filesystem::create_directories(path);
  return path.string();
}

}  // namespace pipecheck::testing
