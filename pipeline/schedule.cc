// Schedule IR, generators and the communication-lowering pass (see schedule.h).
#include "pipeline/schedule.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <deque>
#include <map>
#include <optional>
#include <sstream>
#include <tuple>

namespace pipecheck::pipeline {
namespace {

struct KindName {
  ActionKind kind;
  const char* name;
};

// Longest names first, so parsing "SEND_F" never stops at a shorter prefix.
constexpr KindName kKindNames[] = {
    {ActionKind::kSendForward, "SEND_F"}, {ActionKind::kRecvForward, "RECV_F"},
    {ActionKind::kSendBackward, "SEND_B"}, {ActionKind::kRecvBackward, "RECV_B"},
    {ActionKind::kForward, "F"},           {ActionKind::kBackward, "B"},
    {ActionKind::kBackwardInput, "I"},     {ActionKind::kBackwardWeight, "W"},
};


Schedule EmptySchedule(const std::string& name, const PipelineShape& shape, bool virtual_stages_allowed = false) {
  if (shape.ranks < 1 || shape.microbatches < 1 || shape.virtual_stages < 1) {
    throw ScheduleError(fmt::format("schedule {} needs ranks, virtual stages and microbatches >= 1 (got {}, {}, {})",
                                    name, shape.ranks, shape.virtual_stages, shape.microbatches));
  }
  if (shape.virtual_stages != 1 && !virtual_stages_allowed) {
    throw ScheduleError(fmt::format("schedule {} runs one stage per rank; got {} virtual stages", name,
                                    shape.virtual_stages));
  }
  return Schedule{name, shape, std::vector<std::vector<Action>>(shape.ranks)};
}

// A receive is always safe to post earlier. Each one goes ahead of the sends right before it,
// so no rank can sit in a send while its peer waits for it to post a receive, and then ahead of
// the compute action before those, so its message can land while that action runs: the sender
// finds the receiver ready instead of waiting for it to get round to posting. The sends of the
// action before stay ahead of it (a peer may be waiting on them). The cost, each receive's
// buffer held for one action longer, is in the memory model, which walks these same lists.
void PostReceivesEarly(std::vector<Action>& actions) {
  for (size_t i = 1; i < actions.size(); ++i) {
    if (!actions[i].IsRecv()) continue;
    size_t j = i;
    for (; j > 0 && actions[j - 1].IsSend(); --j) std::swap(actions[j], actions[j - 1]);
    if (j > 0 && actions[j - 1].IsCompute()) std::swap(actions[j], actions[j - 1]);
  }
}

}  // namespace

std::string PipelineShape::PlacementRule() const {
  if (placement == Placement::kV) {
    return fmt::format("in a V: stage s on rank s for s < {0}, on rank {1} - s after", ranks, 2 * ranks - 1);
  }
  return fmt::format("stage s on rank s % {}", ranks);
}

const char* KindText(ActionKind kind) {
  for (const auto& entry : kKindNames) {
    if (entry.kind == kind) return entry.name;
  }
  return "?";
}

std::string Action::ToString() const { return fmt::format("{}{}{}", stage, KindText(kind), microbatch); }

bool Action::IsCompute() const {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward || kind == ActionKind::kBackwardInput ||
         kind == ActionKind::kBackwardWeight;
}
bool Action::IsSend() const { return kind == ActionKind::kSendForward || kind == ActionKind::kSendBackward; }
bool Action::IsRecv() const { return kind == ActionKind::kRecvForward || kind == ActionKind::kRecvBackward; }

bool Action::operator==(const Action& other) const {
  return kind == other.kind && stage == other.stage && microbatch == other.microbatch;
}

bool Action::operator<(const Action& other) const {
  return std::make_tuple(stage, static_cast<int>(kind), microbatch) <
         std::make_tuple(other.stage, static_cast<int>(other.kind), other.microbatch);
}

Action ParseAction(const std::string& text) {
  size_t position = 0;
  while (position < text.size() && std::isdigit(static_cast<unsigned char>(text[position]))) ++position;
  const size_t stage_end = position;
  for (const auto& entry : kKindNames) {
    const std::string name = entry.name;
    if (text.compare(stage_end, name.size(), name) != 0) continue;
    const size_t microbatch_start = stage_end + name.size();
    const bool digits_follow = microbatch_start < text.size() &&
                               std::all_of(text.begin() + microbatch_start, text.end(),
                                           [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    if (stage_end == 0 || !digits_follow || stage_end > 6 || text.size() - microbatch_start > 6) break;
    return Action{entry.kind, std::stoi(text.substr(0, stage_end)), std::stoi(text.substr(microbatch_start))};
  }
  throw ScheduleError(fmt::format("'{}' is not an action: expected STAGE KIND MICROBATCH such as 2F0 or 1SEND_B3 "
                                  "(kinds F, B, I, W, SEND_F, RECV_F, SEND_B, RECV_B)", text));
}

const std::vector<std::string>& ScheduleNames() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> list;
    for (const auto& info : ScheduleRegistry()) list.push_back(info.name);
    return list;
  }();
  return names;
}

const ScheduleInfo* FindSchedule(const std::string& name) {
  for (const auto& info : ScheduleRegistry()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

Schedule GPipeSchedule(const PipelineShape& shape) {
  Schedule schedule = EmptySchedule("gpipe", shape);
  for (int rank = 0; rank < shape.ranks; ++rank) {
    auto& actions = schedule.ranks[rank];
    for (int mb = 0; mb < shape.microbatches; ++mb) actions.push_back({ActionKind::kForward, rank, mb});
    for (int mb = 0; mb < shape.microbatches; ++mb) actions.push_back({ActionKind::kBackward, rank, mb});
  }
  return schedule;
}

Schedule OneFOneBSchedule(const PipelineShape& shape) {
  Schedule schedule = EmptySchedule("1f1b", shape);
  const int m = shape.microbatches;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    auto& actions = schedule.ranks[rank];
    // Warm-up: enough forwards to fill the pipeline below this rank. A rank holds at most
    // warmup + 1 microbatches' activations, which is what makes 1F1B cheaper than GPipe.
    const int warmup = std::min(shape.ranks - 1 - rank, m);
    for (int mb = 0; mb < warmup; ++mb) actions.push_back({ActionKind::kForward, rank, mb});
    // Steady state: each new forward is paired with the oldest outstanding backward.
    const int steady = m - warmup;
    for (int i = 0; i < steady; ++i) {
      actions.push_back({ActionKind::kForward, rank, warmup + i});
      actions.push_back({ActionKind::kBackward, rank, i});
    }
    // Cool-down: drain the backwards of the warm-up forwards.
    for (int mb = steady; mb < m; ++mb) actions.push_back({ActionKind::kBackward, rank, mb});
  }
  return schedule;
}

std::string InterleavedConstraint(const PipelineShape& shape) {
  if (shape.virtual_stages < 2) {
    return fmt::format("interleaved needs virtual_stages >= 2 (got {}; with one stage per rank use 1f1b)",
                       shape.virtual_stages);
  }
  if (shape.microbatches % shape.ranks != 0) {
    return fmt::format("interleaved needs microbatches to be a multiple of the ranks, as Megatron's and PyTorch's "
                       "interleaved schedules do (got {} microbatches on {} ranks)",
                       shape.microbatches, shape.ranks);
  }
  return "";
}

Schedule InterleavedSchedule(const PipelineShape& shape) {
  Schedule schedule = EmptySchedule("interleaved", shape, /*virtual_stages_allowed=*/true);
  const std::string constraint = InterleavedConstraint(shape);
  if (!constraint.empty()) throw ScheduleError(constraint);
  const int p = shape.ranks, v = shape.virtual_stages, m = shape.microbatches;
  const int total = m * v;  // compute steps of each kind per rank
  for (int rank = 0; rank < p; ++rank) {
    // Megatron's order: microbatches go through the rank's chunks in groups of p; forwards walk
    // the chunks up, backwards down. Chunk c of rank r is stage c * p + r.
    auto forward = [&](int k) {
      const int chunk = (k / p) % v;
      return Action{ActionKind::kForward, chunk * p + rank, (k / (p * v)) * p + k % p};
    };
    auto backward = [&](int k) {
      const int chunk = v - 1 - (k / p) % v;
      return Action{ActionKind::kBackward, chunk * p + rank, (k / (p * v)) * p + k % p};
    };
    auto& actions = schedule.ranks[rank];
    const int warmup = std::min(total, (p - rank - 1) * 2 + (v - 1) * p);
    for (int k = 0; k < warmup; ++k) actions.push_back(forward(k));
    for (int k = 0; k < total - warmup; ++k) {
      actions.push_back(forward(warmup + k));
      actions.push_back(backward(k));
    }
    for (int k = total - warmup; k < total; ++k) actions.push_back(backward(k));
  }
  return schedule;
}

Schedule ZeroBubbleH1Schedule(const PipelineShape& shape) {
  // 1F1B's forwards and input gradients (I in B's place), with each rank's weight gradients
  // deferred: rank r runs W of microbatch k right after I of microbatch k + r, and the last r
  // W's after its last I. A microbatch is in flight (its graph kept) from F to W, so rank r holds
  // 1F1B's p - r plus the r deferred ones: p at most on every rank, 1F1B's peak (rank 0's). The
  // deferred W's fill exactly the waits 1F1B has for gradients coming back: with unit costs
  // F = I = W every rank finishes at m(F + I + W) + (p - 1)(F + I - W), the published ZB-H1
  // makespan (Qi et al., "Zero Bubble Pipeline Parallelism"), a third of 1F1B's bubble.
  Schedule schedule = OneFOneBSchedule(shape);
  schedule.name = "zbh1";
  for (int rank = 0; rank < shape.ranks; ++rank) {
    auto& actions = schedule.ranks[rank];
    std::vector<Action> split;
    std::deque<int> pending;  // microbatches whose I has run and whose W has not
    for (const Action& a : actions) {
      if (a.kind != ActionKind::kBackward) {
        split.push_back(a);
        continue;
      }
      split.push_back({ActionKind::kBackwardInput, a.stage, a.microbatch});
      pending.push_back(a.microbatch);
      while (!pending.empty() && pending.front() + rank <= a.microbatch) {
        split.push_back({ActionKind::kBackwardWeight, a.stage, pending.front()});
        pending.pop_front();
      }
    }
    for (int mb : pending) split.push_back({ActionKind::kBackwardWeight, rank, mb});
    actions = std::move(split);
  }
  return schedule;
}

Schedule ZeroBubbleVSchedule(const PipelineShape& shape) {
  if (shape.virtual_stages != 1 && shape.virtual_stages != 2) {
    throw ScheduleError(fmt::format("zbv places two stages per rank in a V: virtual_stages must be 2 (or left out), "
                                    "got {}", shape.virtual_stages));
  }
  PipelineShape v_shape = shape;
  v_shape.virtual_stages = 2;
  v_shape.placement = Placement::kV;
  Schedule schedule = EmptySchedule("zbv", v_shape, /*virtual_stages_allowed=*/true);
  const int p = v_shape.ranks, m = v_shape.microbatches, last = v_shape.stages() - 1;
  constexpr int kKinds = 3;  // F, I, W: each (stage, kind) runs its microbatches in order
  const ActionKind kinds[kKinds] = {ActionKind::kForward, ActionKind::kBackwardInput, ActionKind::kBackwardWeight};
  // finished[kind][stage][mb]: the tick the action ends, or -1 while it has not run.
  std::vector<std::vector<std::vector<int>>> finished(kKinds, std::vector<std::vector<int>>(last + 1, std::vector<int>(m, -1)));
  std::vector<std::vector<int>> next(kKinds, std::vector<int>(last + 1, 0));  // next microbatch per (kind, stage)
  auto done_by = [&](int kind, int stage, int mb, int tick) {
    return finished[kind][stage][mb] >= 0 && finished[kind][stage][mb] <= tick;
  };
  auto ready = [&](int kind, int stage, int tick) {  // the stage's next microbatch of `kind`, or -1
    const int mb = next[kind][stage];
    if (mb >= m) return -1;
    bool ok = false;
    if (kind == 0) ok = stage == 0 || done_by(0, stage - 1, mb, tick);
    if (kind == 1) ok = done_by(0, stage, mb, tick) && (stage == last || done_by(1, stage + 1, mb, tick));
    if (kind == 2) ok = done_by(1, stage, mb, tick);
    return ok ? mb : -1;
  };
  std::vector<int> held(p, 0);  // stage-microbatches between F and W, per rank
  const int total = kKinds * (last + 1) * m;
  int scheduled = 0;
  for (int tick = 0; scheduled < total; ++tick) {
    std::vector<std::pair<int, int>> chosen;  // (kind, stage) per rank that runs this tick
    for (int rank = 0; rank < p; ++rank) {
      const int upper = 2 * p - 1 - rank, lower = rank;  // the V's two stages here, upper first
      auto oldest = [&](int kind) {  // the ready one of the two with the older microbatch
        const int a = ready(kind, upper, tick), b = ready(kind, lower, tick);
        if (a < 0 && b < 0) return -1;
        return (b < 0 || (a >= 0 && a <= b)) ? upper : lower;
      };
      int kind = 1, stage = oldest(1);
      if (stage < 0 && held[rank] < 2 * p) {
        kind = 0;
        stage = ready(0, upper, tick) >= 0 ? upper : (ready(0, lower, tick) >= 0 ? lower : -1);
      }
      if (stage < 0) {
        kind = 2;
        stage = oldest(2);
      }
      chosen.push_back({stage < 0 ? -1 : kind, stage});
    }
    bool progressed = false;
    for (int rank = 0; rank < p; ++rank) {
      const auto [kind, stage] = chosen[rank];
      if (stage < 0) continue;
      const int mb = next[kind][stage]++;
      finished[kind][stage][mb] = tick + 1;
      schedule.ranks[rank].push_back({kinds[kind], stage, mb});
      held[rank] += kind == 0 ? 1 : (kind == 2 ? -1 : 0);
      ++scheduled;
      progressed = true;
    }
    if (!progressed) {
      throw ScheduleError(fmt::format("zbv: no rank can move at tick {} ({} ranks, {} microbatches)", tick, p, m));
    }
  }
  return schedule;
}

const std::vector<ScheduleInfo>& ScheduleRegistry() {
  static const std::vector<ScheduleInfo> registry = {
      {"gpipe", GPipeSchedule, "all forwards, then all backwards", 1, false, 0, Placement::kRoundRobin},
      {"1f1b", OneFOneBSchedule, "warm-up, one forward one backward, cool-down", 1, false, 0, Placement::kRoundRobin},
      {"interleaved", InterleavedSchedule, "Megatron's interleaved 1F1B, v >= 2 stages per rank", 2, true, 0,
       Placement::kRoundRobin},
      {"zbh1", ZeroBubbleH1Schedule, "ZB-H1: 1F1B with split backwards, W's deferred into the waits", 1, false, 0,
       Placement::kRoundRobin},
      {"zbv", ZeroBubbleVSchedule, "ZB-V: two stages per rank in a V, split backwards", 2, true, 2, Placement::kV},
  };
  return registry;
}

Schedule MakeSchedule(const std::string& name, const PipelineShape& shape) {
  if (const ScheduleInfo* info = FindSchedule(name)) return info->generate(shape);
  throw ScheduleError(fmt::format("unknown schedule '{}': expected one of {}", name, fmt::join(ScheduleNames(), ", ")));
}

std::string ScheduleToCsv(const Schedule& schedule) {
  std::string text;
  for (const auto& actions : schedule.ranks) {
    std::vector<std::string> cells;
    for (const auto& action : actions) {
      if (action.IsCompute()) cells.push_back(action.ToString());
    }
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
//   point where stage 2's gradients are final and a data-parallel reduction would run; no action
//   (`reduce_grad_stage` says which stage, for the placement checks).
// Throws ScheduleError naming the rule the cell breaks.
constexpr const char* kOverlapSuffix = ")OVERLAP_F_B";
constexpr const char* kReduceGrad = "REDUCE_GRAD";

std::vector<Action> CellActions(const std::string& cell, std::optional<int>& reduce_grad_stage) {
  reduce_grad_stage.reset();
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
  const std::string reduce = kReduceGrad;
  const size_t digits = cell.find_first_not_of("0123456789");
  if (digits != std::string::npos && digits > 0 && digits <= 6 && cell.compare(digits, std::string::npos, reduce) == 0) {
    reduce_grad_stage = std::stoi(cell.substr(0, digits));
    return {};
  }
  Action action;
  try {
    action = ParseAction(cell);
  } catch (const ScheduleError&) {
    throw ScheduleError("not an action (expected STAGE KIND MICROBATCH such as 0F0, 1B3, 0I1, 0W1, "
                        "an OVERLAP_F_B pair such as (0F3;3B1)OVERLAP_F_B, or STAGE REDUCE_GRAD)");
  }
  if (!action.IsCompute()) {
    throw ScheduleError("communication is added by pipecheck: a compute-only CSV has F, B, I, W, OVERLAP_F_B and "
                        "REDUCE_GRAD");
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
        std::optional<int> reduce_grad_stage;
        for (const Action& action : CellActions(cell, reduce_grad_stage)) {
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

}  // namespace

Schedule ScheduleFromCsv(const std::string& text, const std::string& file, const PipelineShape& shape) {
  Schedule schedule = EmptySchedule("csv:" + file, shape, /*virtual_stages_allowed=*/true);
  std::vector<std::string> rows;
  std::string row;
  // A UTF-8 byte-order mark (spreadsheets write one) is not part of the first cell.
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
  if (static_cast<int>(rows.size()) != shape.ranks) {
    throw ScheduleError(fmt::format("{}: {} rows, but the scenario has {} ranks (one row per rank)", file, rows.size(),
                                    shape.ranks));
  }
  schedule.shape.placement = CsvPlacement(rows, shape);
  std::map<std::tuple<int, int, int>, std::pair<size_t, size_t>> seen;  // (kind, stage, mb) -> (row, cell)
  std::map<int, std::pair<size_t, size_t>> reduced;                     // stage -> its REDUCE_GRAD's (row, cell)
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<std::string> cells = CsvCells(rows[r]);
    for (size_t c = 0; c < cells.size(); ++c) {
      if (cells[c].empty()) continue;  // idle
      const auto where = [&](const std::string& rule) {
        return ScheduleError(fmt::format("{}: row {}, cell {}: '{}': {}", file, r + 1, c + 1, cells[c], rule));
      };
      const auto check_stage = [&](int stage) {
        if (stage >= shape.stages()) {
          throw where(fmt::format("stage {} does not exist ({} ranks x {} virtual stages = {} stages)", stage,
                                  shape.ranks, shape.virtual_stages, shape.stages()));
        }
        if (schedule.shape.RankOfStage(stage) != static_cast<int>(r)) {
          throw where(fmt::format("stage {} runs on rank {} ({}), not on row {}'s rank {}", stage,
                                  schedule.shape.RankOfStage(stage), schedule.shape.PlacementRule(), r + 1, r));
        }
      };
      std::vector<Action> actions;
      std::optional<int> reduce_grad_stage;
      try {
        actions = CellActions(cells[c], reduce_grad_stage);
      } catch (const ScheduleError& error) {
        throw where(error.what());
      }
      if (reduce_grad_stage) {
        check_stage(*reduce_grad_stage);
        auto [previous, inserted] = reduced.emplace(*reduce_grad_stage, std::make_pair(r + 1, c + 1));
        if (!inserted) throw where(fmt::format("repeats row {}, cell {}", previous->second.first, previous->second.second));
      }
      for (const Action& action : actions) {
        check_stage(action.stage);
        if (action.microbatch >= shape.microbatches) {
          throw where(fmt::format("microbatch {} does not exist (the scenario has {})", action.microbatch,
                                  shape.microbatches));
        }
        if (action.kind != ActionKind::kForward && reduced.count(action.stage) > 0) {
          throw where(fmt::format("comes after {}REDUCE_GRAD (row {}, cell {}), which marks stage {}'s gradients final",
                                  action.stage, reduced[action.stage].first, reduced[action.stage].second,
                                  action.stage));
        }
        auto [previous, inserted] = seen.emplace(std::make_tuple(static_cast<int>(action.kind), action.stage,
                                                                 action.microbatch), std::make_pair(r + 1, c + 1));
        if (!inserted) {
          throw where(fmt::format("repeats row {}, cell {}", previous->second.first, previous->second.second));
        }
        schedule.ranks[r].push_back(action);
      }
    }
  }
  // Every stage needs every microbatch forward and backward, whole (B) or split (I and W).
  for (int stage = 0; stage < shape.stages(); ++stage) {
    for (int mb = 0; mb < shape.microbatches; ++mb) {
      auto has = [&](ActionKind kind) { return seen.count({static_cast<int>(kind), stage, mb}) > 0; };
      const int rank = schedule.shape.RankOfStage(stage);
      if (!has(ActionKind::kForward)) {
        throw ScheduleError(fmt::format("{}: row {} lacks {}F{}", file, rank + 1, stage, mb));
      }
      const bool whole = has(ActionKind::kBackward), input = has(ActionKind::kBackwardInput),
                 weight = has(ActionKind::kBackwardWeight);
      if (whole && (input || weight)) {
        throw ScheduleError(fmt::format("{}: row {} has both {}B{} and a split backward (I/W) of it", file, rank + 1,
                                        stage, mb));
      }
      if (!whole && !(input && weight)) {
        throw ScheduleError(fmt::format("{}: row {} lacks {}{}{} (a backward needs B, or both I and W)", file, rank + 1,
                                        stage, !input ? (weight ? "I" : "B") : "W", mb));
      }
    }
  }
  return schedule;
}

Schedule ScheduleByName(const std::string& name, const PipelineShape& shape) {
  const std::string prefix = "csv:";
  if (name.rfind(prefix, 0) != 0) return MakeSchedule(name, shape);
  const std::string path = name.substr(prefix.size());
  std::ifstream stream(path, std::ios::binary);
  if (!stream) throw ScheduleError(fmt::format("{}: cannot open schedule CSV: {}", path, std::strerror(errno)));
  std::stringstream text;
  text << stream.rdbuf();
  return ScheduleFromCsv(text.str(), path, shape);
}

Schedule AddCommunication(const Schedule& schedule, bool post_receives_first) {
  const auto& shape = schedule.shape;
  Schedule lowered{schedule.name, shape, std::vector<std::vector<Action>>(shape.ranks)};
  for (int rank = 0; rank < shape.ranks; ++rank) {
    auto& out = lowered.ranks[rank];
    for (const Action& action : schedule.ranks[rank]) {
      const int s = action.stage, mb = action.microbatch;
      const bool previous_remote = s > 0 && shape.RankOfStage(s - 1) != rank;
      const bool next_remote = s + 1 < shape.stages() && shape.RankOfStage(s + 1) != rank;
      switch (action.kind) {
        case ActionKind::kForward:
          if (previous_remote) out.push_back({ActionKind::kRecvForward, s, mb});
          out.push_back(action);
          if (next_remote) out.push_back({ActionKind::kSendForward, s, mb});
          break;
        case ActionKind::kBackward:
        case ActionKind::kBackwardInput:
          if (next_remote) out.push_back({ActionKind::kRecvBackward, s, mb});
          out.push_back(action);
          if (previous_remote) out.push_back({ActionKind::kSendBackward, s, mb});
          break;
        default:
          out.push_back(action);
      }
    }
    if (post_receives_first) PostReceivesEarly(out);
  }
  return lowered;
}

std::string FormatActions(const Schedule& schedule) {
  std::string text;
  for (size_t rank = 0; rank < schedule.ranks.size(); ++rank) {
    std::vector<std::string> items;
    for (const auto& action : schedule.ranks[rank]) items.push_back(action.ToString());
    text += fmt::format("rank {}: {}\n", rank, fmt::join(items, " "));
  }
  return text;
}

}  // namespace pipecheck::pipeline
