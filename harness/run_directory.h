// A run's --out directory, held for the run's life: one run writes there at a time (an advisory
// lock on OUT/.pipecheck.lock, released by the kernel however the process ends), and what an
// earlier run left there (views/, work/, compare.csv) is cleared first, so nothing read there
// afterwards is stale. Not a report writer: it only guards and clears the directory.
#pragma once

#include <stdexcept>
#include <string>
#include <vector>

namespace pipecheck::harness {

// The directory is busy or holds files pipecheck did not write (bad input: exit 2).
class RunDirectoryError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// rm -r PATH (nothing when it is missing); throws RunDirectoryError naming what could not go.
// Not std::filesystem::remove_all: LibTorch's shared library exports its own build of that
// function, which the dynamic linker may bind in its place, and it crashes (a call through a
// null pointer, seen under AddressSanitizer and in pipecheck run).
void RemoveTree(const std::string& path);

class RunDirectory {
 public:
  // Creates `out`, takes its lock, then removes each of `stale` (paths relative to `out`) left by
  // an earlier pipecheck run. A directory holding one of them that no pipecheck run marked is
  // refused rather than cleared: it may be somebody's own folder.
  RunDirectory(const std::string& out, const std::vector<std::string>& stale);
  ~RunDirectory();
  RunDirectory(const RunDirectory&) = delete;
  RunDirectory& operator=(const RunDirectory&) = delete;

  static constexpr const char* kLockFile = ".pipecheck.lock";

 private:
  int fd_ = -1;
};

}  // namespace pipecheck::harness
