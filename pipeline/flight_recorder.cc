// The flight recorder (see flight_recorder.h).
#include "pipeline/flight_recorder.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>

namespace pipecheck::pipeline {
namespace {

void WriteLine(int fd, const std::string& line) {
  if (fd < 0) return;
  // One write of a short line to an O_APPEND file: never interleaved, never torn in practice.
  if (write(fd, line.data(), line.size()) < 0) {
    // A full disk must not fail the training it only records.
  }
}

}  // namespace

FlightRecorder::FlightRecorder(const std::string& path) {
  fd_ = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (fd_ < 0) throw std::runtime_error(fmt::format("cannot write the flight record {}: {}", path, std::strerror(errno)));
}

FlightRecorder::~FlightRecorder() {
  if (fd_ >= 0) close(fd_);
}

void FlightRecorder::Started(int64_t step, const std::string& what, int peer, double at_us) {
  WriteLine(fd_, fmt::format("S {} {} {} {:.1f}\n", step, what, peer, at_us));
}

void FlightRecorder::Ended(double at_us) { WriteLine(fd_, fmt::format("E {:.1f}\n", at_us)); }

std::vector<FlightEntry> ReadFlightRecord(const std::string& path) {
  std::ifstream stream(path);
  std::vector<FlightEntry> entries;
  std::string line;
  while (std::getline(stream, line)) {
    if (stream.eof()) break;  // no newline: a line cut short
    std::istringstream fields(line);
    std::string kind;
    fields >> kind;
    if (kind == "S") {
      FlightEntry entry;
      if (fields >> entry.step >> entry.what >> entry.peer >> entry.start_us) entries.push_back(entry);
    } else if (kind == "E" && !entries.empty() && !entries.back().end_us) {
      double end = 0.0;
      if (fields >> end) entries.back().end_us = end;
    }
  }
  return entries;
}

std::string DescribeLastEntry(const std::vector<FlightEntry>& entries, std::optional<bool> computing) {
  const std::string busy = computing && *computing ? ", computing" : "";
  if (entries.empty()) return "recorded nothing (it had not reached its first action)" + busy;
  const FlightEntry& last = entries.back();
  std::string peer;
  const bool receives = last.what.find("RECV") != std::string::npos;
  const bool sends = last.what.find("SEND") != std::string::npos;
  if (last.peer >= 0) peer = fmt::format(" {} rank {}", receives ? "from" : (sends ? "to" : "with"), last.peer);
  if (!last.end_us && computing) {
    if (*computing) return fmt::format("computing {} (step {})", last.what, last.step);
    if (last.peer >= 0 && !receives && !sends) {
      return fmt::format("waiting in {} (step {}) for its input from rank {}", last.what, last.step, last.peer);
    }
    return fmt::format("waiting in {}{} (step {})", last.what, peer, last.step);
  }
  if (!last.end_us) {
    if (last.peer >= 0 && !receives && !sends) {
      // A compute action first takes its input: it may be waiting for it, or computing.
      return fmt::format("blocked in {} (step {}): awaiting its input from rank {}, or computing", last.what, last.step,
                         last.peer);
    }
    return fmt::format("blocked in {}{} (step {})", last.what, peer, last.step);
  }
  return fmt::format("last finished {}{} (step {}); nothing started since{}", last.what, receives || sends ? peer : "",
                     last.step, busy);
}

std::optional<ActionTiming> TimingOf(const FlightEntry& entry, double unfinished_end_us) {
  ActionTiming timing;
  try {
    timing.action = ParseAction(entry.what);
  } catch (const ScheduleError&) {
    return std::nullopt;
  }
  timing.step = entry.step;
  timing.start_us = timing.wait_start_us = entry.start_us;
  timing.end_us = entry.end_us.value_or(unfinished_end_us);
  return timing;
}

}  // namespace pipecheck::pipeline
