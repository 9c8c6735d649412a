// Schedule CSV import and export (see schedule_csv.h).
#include "pipeline/schedule_csv.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "pipeline/message.h"
#include "pipeline/schedule_name.h"

namespace pipecheck::pipeline {

std::string ScheduleToCsv(const Schedule& schedule, CsvFormat format) {
  std::string text;
  for (const auto& actions : schedule.ranks) {
    std::vector<std::string> cells;
    // compute_comms: where pipecheck waits for a send, as PyTorch 2.15's WAIT_SEND_F / WAIT_SEND_B
    // name it (by the send's stage and microbatch): just before the next send to the same peer in
    // the same direction, and the rest at the end of the step, in the order sent.
    std::vector<Action> unwaited;  // sends not yet waited for, in the order sent
    const auto wait = [&cells](const Action& send) {
      cells.push_back(fmt::format("{}WAIT_SEND_{}{}", send.stage, send.kind == ActionKind::kSendForward ? "F" : "B",
                                  send.microbatch));
    };
    for (const auto& action : actions) {
      if (format == CsvFormat::kComputeOnly && !action.IsCompute()) continue;
      if (action.IsSend()) {
        const auto previous = std::find_if(unwaited.begin(), unwaited.end(), [&](const Action& send) {
          return send.kind == action.kind && PeerOf(schedule.shape, send) == PeerOf(schedule.shape, action);
        });
        if (previous != unwaited.end()) {
          wait(*previous);
          unwaited.erase(previous);
        }
        unwaited.push_back(action);
      }
      cells.push_back(action.ToString());
    }
    for (const Action& send : unwaited) wait(send);
    text += fmt::format("{}\n", fmt::join(cells, ","));
  }
  return text;
}

namespace {

std::vector<std::string> CsvCells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  for (char c : row + ",") {
    if (c == ',') {
      cells.push_back(cell);
      cell.clear();
    } else if (c != ' ' && c != '\t') {
      cell += c;
    }
  }
  return cells;
}

// One cell of PyTorch's compute-only CSV, as the actions pipecheck runs for it:
// - `0F0`, `1B3`, `0I1`, `0W1`: that action;
// - `(0F3;3B1)OVERLAP_F_B` (DualPipeV): its sub-actions, run one after the other in the order
//   written (PyTorch overlaps them on two streams; the arithmetic is the same);
// - `2REDUCE_GRAD` (every PyTorch schedule's `pipeline_order` ends each stage with one): the
//   point where stage 2's gradients are final and a data-parallel reduction would start; no
//   action (`marker` says which stage, for the placement checks);
// - `2WAIT_REDUCE_GRAD` (PyTorch 2.15 pairs each REDUCE_GRAD with one): where that reduction is
//   waited for; no action either, and it must follow its stage's REDUCE_GRAD.
// Throws ScheduleError naming the rule the cell breaks.
constexpr const char* kOverlapSuffix = ")OVERLAP_F_B";
constexpr const char* kReduceGrad = "REDUCE_GRAD";
constexpr const char* kWaitReduceGrad = "WAIT_REDUCE_GRAD";

// A cell that runs nothing: a stage's gradient reduction (REDUCE_GRAD, WAIT_REDUCE_GRAD) or,
// in compute_comms, the wait for an earlier send (WAIT_SEND_F, WAIT_SEND_B: PyTorch 2.15).
struct Marker {
  enum Kind { kNone, kReduce, kWait, kWaitSendForward, kWaitSendBackward } kind = kNone;
  int stage = 0;
  int microbatch = 0;
};

// Each marker's name after the stage; the send waits also end in the send's microbatch.
struct MarkerName {
  const char* name;
  Marker::Kind kind;
  bool microbatch;
};
constexpr MarkerName kMarkers[] = {{kReduceGrad, Marker::kReduce, false},
                                   {kWaitReduceGrad, Marker::kWait, false},
                                   {"WAIT_SEND_F", Marker::kWaitSendForward, true},
                                   {"WAIT_SEND_B", Marker::kWaitSendBackward, true}};

std::vector<Action> CellActions(const std::string& cell, Marker& marker) {
  marker = Marker();
  const std::string overlap = kOverlapSuffix;
  if (cell.size() > overlap.size() + 1 && cell.front() == '(' &&
      cell.compare(cell.size() - overlap.size(), overlap.size(), overlap) == 0) {
    std::vector<Action> actions;
    std::string inner = cell.substr(1, cell.size() - overlap.size() - 1) + ";";
    for (size_t start = 0, end; (end = inner.find(';', start)) != std::string::npos; start = end + 1) {
      const std::string part = inner.substr(start, end - start);
      Action action;
      try {
        action = ParseAction(part);
      } catch (const ScheduleError&) {
        throw ScheduleError(fmt::format("sub-action '{}' is not an action (expected (F;B) pairs such as (0F3;3B1))",
                                        part));
      }
      if (!action.IsCompute()) throw ScheduleError(fmt::format("sub-action '{}' is not a compute action", part));
      actions.push_back(action);
    }
    if (actions.size() != 2) {
      throw ScheduleError(fmt::format("OVERLAP_F_B holds {} sub-actions; PyTorch's holds two", actions.size()));
    }
    return actions;
  }
  const size_t digits = cell.find_first_not_of("0123456789");
  if (digits != std::string::npos && digits > 0 && digits <= 6) {
    for (const auto& [name, kind, has_microbatch] : kMarkers) {
      const size_t length = std::strlen(name);
      if (cell.compare(digits, length, name) != 0) continue;
      const std::string rest = cell.substr(digits + length);
      if (!has_microbatch) {
        if (!rest.empty()) continue;
        marker = {kind, std::stoi(cell.substr(0, digits))};
        return {};
      }
      if (rest.empty() || rest.size() > 6 || rest.find_first_not_of("0123456789") != std::string::npos) {
        throw ScheduleError(fmt::format("{} needs a microbatch: STAGE {} MICROBATCH such as 0{}0", name, name, name));
      }
      marker = {kind, std::stoi(cell.substr(0, digits)), std::stoi(rest)};
      return {};
    }
  }
  Action action;
  try {
    action = ParseAction(cell);
  } catch (const ScheduleError&) {
    throw ScheduleError("not an action (expected STAGE KIND MICROBATCH such as 0F0, 1B3, 0I1, 0W1, 0SEND_F0, "
                        "1RECV_F0, 0WAIT_SEND_F0, an OVERLAP_F_B pair such as (0F3;3B1)OVERLAP_F_B, STAGE "
                        "REDUCE_GRAD or STAGE WAIT_REDUCE_GRAD)");
  }
  return {action};
}

// PyTorch's CSV names no placement. With two stages per rank, the first cell whose stage the
// two placements put on different ranks decides: on the V's rank it is a V (ZBV, DualPipeV),
// otherwise round robin, against which every cell is then checked.
Placement CsvPlacement(const std::vector<std::string>& rows, const PipelineShape& shape) {
  PipelineShape v = shape;
  v.placement = Placement::kV;
  if (shape.virtual_stages != 2) return Placement::kRoundRobin;
  for (size_t r = 0; r < rows.size(); ++r) {
    for (const auto& cell : CsvCells(rows[r])) {
      if (cell.empty()) continue;
      try {
        Marker marker;
        for (const Action& action : CellActions(cell, marker)) {
          if (action.stage < shape.stages() && v.RankOfStage(action.stage) != shape.RankOfStage(action.stage)) {
            return v.RankOfStage(action.stage) == static_cast<int>(r) ? Placement::kV : Placement::kRoundRobin;
          }
        }
      } catch (const ScheduleError&) {
        // reported, with its place, when the cells are read
      }
    }
  }
  return Placement::kRoundRobin;
}

// The file's rows: a UTF-8 byte-order mark (spreadsheets write one) and carriage returns dropped,
// trailing blank rows too.
std::vector<std::string> CsvRows(const std::string& text) {
  std::vector<std::string> rows;
  std::string row;
  const size_t first = text.rfind("\xEF\xBB\xBF", 0) == 0 ? 3 : 0;
  for (char c : text.substr(first)) {
    if (c == '\n') {
      rows.push_back(row);
      row.clear();
    } else if (c != '\r') {
      row += c;
    }
  }
  if (!row.empty()) rows.push_back(row);
  while (!rows.empty() && rows.back().find_first_not_of(" \t,") == std::string::npos) rows.pop_back();
  return rows;
}

// Reads the cells of one file into a schedule, cell by cell, and checks the whole at the end;
// every error names the file, the row and cell (1-based) and the rule broken.
class CsvImport {
 public:
  CsvImport(const std::string& file, const PipelineShape& shape, Schedule& schedule)
      : file_(file), shape_(shape), schedule_(schedule) {}

  void ReadCell(size_t r, size_t c, const std::string& cell) {
    const auto where = [&](const std::string& rule) {
      return ScheduleError(fmt::format("{}: row {}, cell {}: '{}': {}", file_, r + 1, c + 1, cell, rule));
    };
    std::vector<Action> actions;
    Marker marker;
    try {
      actions = CellActions(cell, marker);
    } catch (const ScheduleError& error) {
      throw where(error.what());
    }
    if (marker.kind == Marker::kWaitSendForward || marker.kind == Marker::kWaitSendBackward) {
      const Action send{marker.kind == Marker::kWaitSendForward ? ActionKind::kSendForward
                                                                    : ActionKind::kSendBackward,
                        marker.stage, marker.microbatch};
      waits_sends_ = true;
      if (unwaited_sends_.erase(std::make_pair(r, send)) == 0) {
        throw where(fmt::format("waits for {}, which this row has not sent (or has waited for already)",
                                send.ToString()));
      }
    } else if (marker.kind != Marker::kNone) {
      CheckStage(marker.stage, r, where);
      auto& seen = marker.kind == Marker::kReduce ? reduced_ : waited_;
      auto [previous, inserted] = seen.emplace(marker.stage, std::make_pair(r + 1, c + 1));
      if (!inserted) throw where(fmt::format("repeats row {}, cell {}", previous->second.first, previous->second.second));
      if (marker.kind == Marker::kWait && reduced_.count(marker.stage) == 0) {
        throw where(fmt::format("waits for stage {}'s reduction before its {}REDUCE_GRAD starts it", marker.stage,
                                marker.stage));
      }
    }
    for (const Action& action : actions) {
      CheckStage(action.stage, r, where);
      if (action.microbatch >= shape_.microbatches) {
        throw where(fmt::format("microbatch {} does not exist (the scenario has {})", action.microbatch,
                                shape_.microbatches));
      }
      if (!action.IsCompute()) {  // compute_comms: checked, then left to pipecheck's own lowering
        CheckMessage(action, r, where);
        if (action.IsSend()) unwaited_sends_.insert(std::make_pair(r, action));
        continue;
      }
      if (action.kind != ActionKind::kForward && reduced_.count(action.stage) > 0) {
        throw where(fmt::format("comes after {}REDUCE_GRAD (row {}, cell {}), which marks stage {}'s gradients final",
                                action.stage, reduced_[action.stage].first, reduced_[action.stage].second,
                                action.stage));
      }
      auto [previous, inserted] = seen_.emplace(std::make_tuple(static_cast<int>(action.kind), action.stage,
                                                                action.microbatch), std::make_pair(r + 1, c + 1));
      if (!inserted) throw where(fmt::format("repeats row {}, cell {}", previous->second.first, previous->second.second));
      schedule_.ranks[r].push_back(action);
    }
  }

  // Every stage needs every microbatch forward and backward, whole (B) or split (I and W); a file
  // that waits for its sends (WAIT_SEND_F/B, PyTorch 2.15's compute_comms) waits for every one.
  void CheckComplete() const {
    if (waits_sends_ && !unwaited_sends_.empty()) {
      const auto& [row, send] = *unwaited_sends_.begin();
      throw ScheduleError(fmt::format("{}: row {} never waits for {} (a file with WAIT_SEND cells waits for every send)",
                                      file_, row + 1, send.ToString()));
    }
    for (int stage = 0; stage < shape_.stages(); ++stage) {
      for (int mb = 0; mb < shape_.microbatches; ++mb) {
        auto has = [&](ActionKind kind) { return seen_.count({static_cast<int>(kind), stage, mb}) > 0; };
        const int rank = schedule_.shape.RankOfStage(stage);
        if (!has(ActionKind::kForward)) throw ScheduleError(fmt::format("{}: row {} lacks {}F{}", file_, rank + 1, stage, mb));
        const bool whole = has(ActionKind::kBackward), input = has(ActionKind::kBackwardInput),
                   weight = has(ActionKind::kBackwardWeight);
        if (whole && (input || weight)) {
          throw ScheduleError(fmt::format("{}: row {} has both {}B{} and a split backward (I/W) of it", file_, rank + 1,
                                          stage, mb));
        }
        if (!whole && !(input && weight)) {
          throw ScheduleError(fmt::format("{}: row {} lacks {}{}{} (a backward needs B, or both I and W)", file_,
                                          rank + 1, stage, !input ? (weight ? "I" : "B") : "W", mb));
        }
      }
    }
  }

 private:
  template <typename Where>
  void CheckStage(int stage, size_t r, const Where& where) const {
    if (stage >= shape_.stages()) {
      throw where(fmt::format("stage {} does not exist ({} ranks x {} virtual stages = {} stages)", stage, shape_.ranks,
                              shape_.virtual_stages, shape_.stages()));
    }
    if (schedule_.shape.RankOfStage(stage) != static_cast<int>(r)) {
      throw where(fmt::format("stage {} runs on rank {} ({}), not on row {}'s rank {}", stage,
                              schedule_.shape.RankOfStage(stage), schedule_.shape.PlacementRule(), r + 1, r));
    }
  }

  // A communication cell names a message between this row's rank and another.
  template <typename Where>
  void CheckMessage(const Action& action, size_t r, const Where& where) const {
    const Message message = MessageOf(action);
    const int from = message.FromStage(), to = message.stage;
    if (from < 0 || from >= shape_.stages() || to < 0 || to >= shape_.stages()) {
      throw where(action.IsSend()
                      ? fmt::format("stage {} sends to stage {}, which does not exist", from, to)
                      : fmt::format("stage {} receives from stage {}, which does not exist", to, from));
    }
    if (SenderRank(schedule_.shape, message) == ReceiverRank(schedule_.shape, message)) {
      throw where(fmt::format("stages {} and {} both run on rank {}: their tensor never goes through the transport", from,
                              to, r));
    }
  }

  const std::string& file_;
  const PipelineShape& shape_;
  Schedule& schedule_;
  std::map<std::tuple<int, int, int>, std::pair<size_t, size_t>> seen_;  // (kind, stage, mb) -> (row, cell)
  std::map<int, std::pair<size_t, size_t>> reduced_;                     // stage -> its REDUCE_GRAD's (row, cell)
  std::map<int, std::pair<size_t, size_t>> waited_;                      // stage -> its WAIT_REDUCE_GRAD's
  std::set<std::pair<size_t, Action>> unwaited_sends_;                   // (row, send) not yet waited for
  bool waits_sends_ = false;                                             // any WAIT_SEND cell seen
};

}  // namespace

Schedule ScheduleFromCsv(const std::string& text, const std::string& file, const PipelineShape& shape) {
  Schedule schedule = EmptySchedule(ScheduleCsvName(file), shape, /*virtual_stages_allowed=*/true);
  const std::vector<std::string> rows = CsvRows(text);
  if (static_cast<int>(rows.size()) != shape.ranks) {
    throw ScheduleError(fmt::format("{}: {} rows, but the scenario has {} ranks (one row per rank)", file, rows.size(),
                                    shape.ranks));
  }
  schedule.shape.placement = CsvPlacement(rows, shape);
  CsvImport import(file, shape, schedule);
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<std::string> cells = CsvCells(rows[r]);
    for (size_t c = 0; c < cells.size(); ++c) {
      if (!cells[c].empty()) import.ReadCell(r, c, cells[c]);  // an empty cell: the rank is idle
    }
  }
  import.CheckComplete();
  return schedule;
}

Schedule ScheduleByName(const std::string& name, const PipelineShape& shape) {
  const auto path = ScheduleCsvPath(name);
  if (!path) return MakeSchedule(name, shape);
  std::ifstream stream(*path, std::ios::binary);
  if (!stream) throw ScheduleError(fmt::format("{}: cannot open schedule CSV: {}", *path, std::strerror(errno)));
  std::stringstream text;
  text << stream.rdbuf();
  return ScheduleFromCsv(text.str(), *path, shape);
}

}  // namespace pipecheck::pipeline
