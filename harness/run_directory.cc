// The run directory's lock and clearing (see run_directory.h).
#include "harness/run_directory.h"

#include <fcntl.h>
#include <ftw.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace pipecheck::harness {
namespace fs = std::filesystem;

namespace {

// Whether an earlier pipecheck run wrote `out`: its lock file, or a summary.csv of ours (runs
// from before the lock file existed).
bool WrittenByPipecheck(const fs::path& out) {
  if (fs::exists(out / RunDirectory::kLockFile)) return true;
  std::ifstream summary(out / "summary.csv");
  std::string header;
  return std::getline(summary, header) && header.rfind("scenario,status,expect,ok,", 0) == 0;
}

int RemoveEntry(const char* path, const struct stat*, int type, struct FTW*) {
  return (type == FTW_DP ? rmdir(path) : unlink(path)) == 0 ? 0 : errno;
}

}  // namespace

void RemoveTree(const std::string& path) {
  struct stat status {};
  if (lstat(path.c_str(), &status) != 0 && errno == ENOENT) return;
  const int error = nftw(path.c_str(), RemoveEntry, 16, FTW_DEPTH | FTW_PHYS);
  if (error != 0) {
    throw RunDirectoryError(fmt::format("cannot remove {}: {}", path, std::strerror(error > 0 ? error : errno)));
  }
}

RunDirectory::RunDirectory(const std::string& out, const std::vector<std::string>& stale) {
  const fs::path directory(out);
  fs::create_directories(directory);
  const bool ours = WrittenByPipecheck(directory);
  const std::string lock = (directory / kLockFile).string();
  fd_ = open(lock.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw RunDirectoryError(fmt::format("--out {}: cannot create {}: {}", out, lock, std::strerror(errno)));
  if (flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    char text[32] = {};
    const ssize_t length = pread(fd_, text, sizeof(text) - 1, 0);
    close(fd_);
    fd_ = -1;
    if (error == EWOULDBLOCK) {
      throw RunDirectoryError(fmt::format(
          "--out {} is in use by another pipecheck run{}: two runs there would overwrite each other's reports; "
          "give this one another --out, or wait", out, length > 0 ? fmt::format(" (pid {})", std::string(text, length)) : ""));
    }
    throw RunDirectoryError(fmt::format("--out {}: cannot lock {}: {}", out, lock, std::strerror(error)));
  }
  const std::string pid = std::to_string(getpid());
  if (ftruncate(fd_, 0) != 0 || pwrite(fd_, pid.data(), pid.size(), 0) != static_cast<ssize_t>(pid.size())) {
    // The pid only makes the busy message friendlier; the lock holds without it.
  }
  for (const auto& name : stale) {
    const fs::path path = directory / name;
    if (!fs::exists(path)) continue;
    if (!ours) {
      throw RunDirectoryError(fmt::format("--out {} holds {}, which no pipecheck run wrote: a run clears it first, so "
                                          "choose another --out", out, path.string()));
    }
    RemoveTree(path.string());
  }
}

RunDirectory::~RunDirectory() {
  if (fd_ >= 0) close(fd_);  // releases the lock; the file stays as the directory's mark
}

}  // namespace pipecheck::harness
