// What a rank is doing, kept where it outlives the rank: each action (and each step's gradient
// synchronisation) appends a line to a file as it starts and another as it ends, with one
// write(2) each, so the lines are in the kernel's hands at once and survive a crash, a hang that
// ends in SIGKILL, or the OOM killer. A launcher that finds a rank dead or stuck reads them to say
// what it was doing (`1RECV_B2 from rank 2, step 1`) and to draw the timeline up to that moment.
// Not the timeline of a finished step (ActionTiming, on the device's clock): host time only.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/action_timing.h"

namespace pipecheck::pipeline {

class FlightRecorder {
 public:
  FlightRecorder() = default;  // records nothing
  explicit FlightRecorder(const std::string& path);  // starts the file afresh; throws if it cannot
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  // `what`: an action as the schedule writes it ("1RECV_B2") or a phase ("tied_sync"); `peer`
  // the rank it talks to (-1 none); times in µs on the rank's run clock.
  void Started(int64_t step, const std::string& what, int peer, double at_us);
  void Ended(double at_us);

 private:
  int fd_ = -1;
};

// One recorded entry; `end_us` is empty while it had not ended.
struct FlightEntry {
  int64_t step = 0;
  std::string what;
  int peer = -1;
  double start_us = 0.0;
  std::optional<double> end_us;
};

// A recorder's file read back ({} when it is missing); a torn last line is ignored.
std::vector<FlightEntry> ReadFlightRecord(const std::string& path);

// An entry as an executed action on the run's clock (held and peak bytes unmetered, no wait
// apart), one that had not ended ending at `unfinished_end_us`; none for a phase outside the
// schedule (gradient_sync, results_to_rank_0).
std::optional<ActionTiming> TimingOf(const FlightEntry& entry, double unfinished_end_us);

// "blocked in 1RECV_B2 from rank 2 (step 1)", "last finished 0F3 (step 0); nothing started
// since", or "recorded nothing (it had not reached its first action)". Where the caller knows
// whether the rank was using CPU time (`computing`), an unfinished action reads "computing 0B3
// (step 1)" or "waiting in 1RECV_B2 for rank 2 (step 1)" instead of "blocked in".
std::string DescribeLastEntry(const std::vector<FlightEntry>& entries, std::optional<bool> computing = std::nullopt);

}  // namespace pipecheck::pipeline
