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



}  // namespace

Schedule EmptySchedule(const std::string& name, const PipelineShape& shape, bool virtual_stages_allowed) {
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

Schedule RepeatRounds(const Schedule& schedule, int rounds) {
  if (rounds < 1) throw ScheduleError(fmt::format("schedule {}: rounds must be >= 1, got {}", schedule.name, rounds));
  Schedule repeated = schedule;
  if (rounds == 1) return repeated;
  const int m = schedule.shape.microbatches;
  repeated.name = fmt::format("{} x {} rounds", schedule.name, rounds);
  repeated.shape.microbatches = m * rounds;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    auto& actions = repeated.ranks[r];
    actions.clear();
    actions.reserve(schedule.ranks[r].size() * static_cast<size_t>(rounds));
    for (int round = 0; round < rounds; ++round) {
      for (Action action : schedule.ranks[r]) {
        action.microbatch += round * m;
        actions.push_back(action);
      }
    }
  }
  return repeated;
}

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

Schedule LoopedBfsSchedule(const PipelineShape& shape) {
  Schedule schedule = EmptySchedule("loopedbfs", shape, /*virtual_stages_allowed=*/true);
  const int p = shape.ranks, m = shape.microbatches, v = shape.virtual_stages;
  for (int rank = 0; rank < p; ++rank) {
    auto& actions = schedule.ranks[rank];
    for (int local = 0; local < v; ++local) {
      for (int mb = 0; mb < m; ++mb) actions.push_back({ActionKind::kForward, rank + local * p, mb});
    }
    for (int local = v - 1; local >= 0; --local) {
      for (int mb = m - 1; mb >= 0; --mb) actions.push_back({ActionKind::kBackward, rank + local * p, mb});
    }
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

namespace {

// A schedule with two stages per rank in a V, no actions yet: virtual_stages 2, or 1 (a scenario
// that left the column out) taken as 2.
Schedule EmptyVSchedule(const std::string& name, const PipelineShape& shape) {
  if (shape.virtual_stages != 1 && shape.virtual_stages != 2) {
    throw ScheduleError(fmt::format("{} places two stages per rank in a V: virtual_stages must be 2 (or left out), "
                                    "got {}", name, shape.virtual_stages));
  }
  PipelineShape v_shape = shape;
  v_shape.virtual_stages = 2;
  v_shape.placement = Placement::kV;
  return EmptySchedule(name, v_shape, /*virtual_stages_allowed=*/true);
}

}  // namespace

// ZB-V as the zero-bubble paper's V schedule lays it out and PyTorch's ScheduleZBVZeroBubble builds
// it, rank by rank. Rank r holds the V's down stage r and up stage 2p-1-r; counting microbatches
// up to n = max(m, 2p - 1) (those past m are left out at the end):
//   warm-up: 2(p - r) - 1 forwards of the down stage; r times an up forward then a down one; p - r
//   times the up stage's F, I and W;
//   steady: while a down forward is left or the up stage is behind, the down stage's F (while
//   any is left), I and W, then the up stage's F, I and W;
//   cool-down: r times the down then the up stage's I; p - r times the down stage's I and its
//   oldest W; the up stage's W's left, then the down stage's.
// Every stage runs its F's, I's and W's in microbatch order. At p = 2, m = 8 its bubble is 0.030
// with F = I = W, where the list scheduling pipecheck used before left 0.045, and its waits on a
// CPU, where the first stage's I is empty and its W a whole backward, 14-30 ms a step where that
// one's were 60 (benchmarks/peer.csv's ZB-V row).
Schedule ZeroBubbleVSchedule(const PipelineShape& shape) {
  Schedule schedule = EmptyVSchedule("zbv", shape);
  const int p = schedule.shape.ranks, m = schedule.shape.microbatches;
  const int n = std::max(m, 2 * p - 1);
  for (int r = 0; r < p; ++r) {
    auto& actions = schedule.ranks[r];
    const int down = r, up = 2 * p - 1 - r;
    int down_f = 0, up_f = 0, down_b = 0, up_b = 0;  // the next forward and I of each stage
    const auto add = [&](ActionKind kind, int stage, int mb) {
      if (mb < m) actions.push_back({kind, stage, mb});
    };
    const auto forward = [&](int stage, int& next) { add(ActionKind::kForward, stage, next++); };
    const auto input_and_weight = [&](int stage, int& next) {
      add(ActionKind::kBackwardInput, stage, next);
      add(ActionKind::kBackwardWeight, stage, next++);
    };
    for (int i = 0; i < 2 * (p - r) - 1; ++i) forward(down, down_f);
    for (int i = 0; i < r; ++i) {
      forward(up, up_f);
      forward(down, down_f);
    }
    for (int i = 0; i < p - r; ++i) {
      forward(up, up_f);
      input_and_weight(up, up_b);
    }
    while (up_f < down_f || down_f < n) {
      if (down_f < n) forward(down, down_f);
      input_and_weight(down, down_b);
      forward(up, up_f);
      input_and_weight(up, up_b);
    }
    int down_w = down_b, up_w = up_b;
    for (int i = 0; i < r; ++i) {
      add(ActionKind::kBackwardInput, down, down_b++);
      add(ActionKind::kBackwardInput, up, up_b++);
    }
    for (int i = 0; i < p - r; ++i) {
      add(ActionKind::kBackwardInput, down, down_b++);
      add(ActionKind::kBackwardWeight, down, down_w++);
    }
    while (up_w < up_b) add(ActionKind::kBackwardWeight, up, up_w++);
    while (down_w < down_b) add(ActionKind::kBackwardWeight, down, down_w++);
    if (down_f != n || up_f != n || down_b != n || up_b != n) {
      throw ScheduleError(fmt::format("zbv: rank {} built {} and {} forwards, {} and {} backwards for {} microbatches "
                                      "({} ranks)", r, down_f, up_f, down_b, up_b, n, p));
    }
  }
  return schedule;
}

Schedule DualPipeVSchedule(const PipelineShape& shape) {
  Schedule schedule = EmptyVSchedule("dualpipev", shape);
  const PipelineShape& v_shape = schedule.shape;
  const int p = v_shape.ranks, m = v_shape.microbatches;
  if (m < 2 * p) {
    throw ScheduleError(fmt::format("dualpipev needs at least as many microbatches as stages: {} microbatches for {} "
                                    "stages ({} ranks)", m, 2 * p, p));
  }
  for (int r = 0; r < p; ++r) {
    auto& actions = schedule.ranks[r];
    const int down = r, up = 2 * p - 1 - r;  // the V's two stages on this rank
    std::map<int, int> forwards, backwards;    // per stage: the next microbatch to forward, to backward
    std::deque<std::pair<int, int>> weights;   // (stage, mb) of I's whose W has not run, oldest first
    bool split = false;                        // backwards split into I and W (the cool-down's second half)
    const auto forward = [&](int stage) { actions.push_back({ActionKind::kForward, stage, forwards[stage]++}); };
    const auto backward = [&](int stage, bool split_it) {
      const int mb = backwards[stage]++;
      actions.push_back({split_it ? ActionKind::kBackwardInput : ActionKind::kBackward, stage, mb});
      if (split_it) weights.emplace_back(stage, mb);
    };
    const auto pending_weight = [&] {
      if (weights.empty()) return;
      actions.push_back({ActionKind::kBackwardWeight, weights.front().first, weights.front().second});
      weights.pop_front();
    };
    // A forward of one stage overlapped with a whole backward of the other (DualPipe's F&B pair):
    // here the two run one after the other, the forward first.
    const auto forward_and_backward = [&](int forward_stage, int backward_stage) {
      forward(forward_stage);
      backward(backward_stage, false);
    };
    for (int i = 0; i < 2 * (p - r - 1); ++i) forward(down);  // 1: the down stage fills the V
    for (int i = 0; i < r + 1; ++i) forward(down), forward(up);  // 2: both stages
    for (int i = 0; i < p - r - 1; ++i) {                         // 3: I, W, F on the up stage
      backward(up, true);
      pending_weight();
      forward(up);
    }
    for (int i = 0; i < m - 2 * p + r + 1; ++i) {  // 4: the steady state, F&B pairs both ways
      forward_and_backward(down, up);
      forward_and_backward(up, down);
    }
    for (int i = 0; i < p - r - 1; ++i) {  // 5: the up stage's backwards, with the last forwards
      backward(up, false);
      forward_and_backward(up, down);
    }
    for (int i = 0; i < r + 1; ++i) {  // 6: both stages' backwards, split from the middle on
      if (i == (r + 1) / 2 && r % 2 == 1) split = true;
      backward(up, split);
      if (i == (r + 1) / 2 && r % 2 == 0) split = true;
      backward(down, split);
    }
    for (int i = 0; i < p - r - 1; ++i) {  // 7: the down stage's last backwards, W's between
      pending_weight();
      backward(down, split);
    }
    while (!weights.empty()) pending_weight();  // 8: the W's left
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
      {"dualpipev", DualPipeVSchedule, "DualPipeV: two stages per rank in a V, forward-backward pairs both ways", 2,
       true, 2, Placement::kV},
      {"loopedbfs", LoopedBfsSchedule,
       "looped BFS (PyTorch's ScheduleLoopedBFS): each local stage's forwards for every microbatch, then the "
       "backwards stage by stage, newest microbatch first",
       2, true, 0, Placement::kRoundRobin},
  };
  return registry;
}

Schedule MakeSchedule(const std::string& name, const PipelineShape& shape) {
  if (const ScheduleInfo* info = FindSchedule(name)) return info->generate(shape);
  throw ScheduleError(fmt::format("unknown schedule '{}': expected one of {}", name, fmt::join(ScheduleNames(), ", ")));
}

Schedule SplitDrainBackwards(const Schedule& schedule) {
  Schedule split = schedule;
  const PipelineShape& shape = schedule.shape;
  for (auto& actions : split.ranks) {
    std::map<int, size_t> last;  // stage -> index of its last backward, B or I
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = actions[i];
      if ((a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardInput) && a.stage > 0 &&
          shape.RankOfStage(a.stage - 1) != shape.RankOfStage(a.stage)) {
        last[a.stage] = i;
      }
    }
    std::vector<size_t> at;  // the last backwards still whole, with a forward just before them
    for (const auto& [stage, index] : last) {
      if (actions[index].kind != ActionKind::kBackward) continue;
      size_t before = index;
      while (before > 0 && !actions[before - 1].IsCompute()) --before;
      if (before > 0 && actions[before - 1].kind == ActionKind::kForward) at.push_back(index);
    }
    std::sort(at.rbegin(), at.rend());  // from the back, so earlier indices stay put
    for (const size_t i : at) {
      actions[i].kind = ActionKind::kBackwardInput;
      actions.insert(actions.begin() + static_cast<std::ptrdiff_t>(i) + 1,
                     Action{ActionKind::kBackwardWeight, actions[i].stage, actions[i].microbatch});
    }
  }
  return split;
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
