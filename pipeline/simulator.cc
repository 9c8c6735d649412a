// The lockstep schedule simulator (see simulator.h).
#include "pipeline/simulator.h"

#include "pipeline/message.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

namespace pipecheck::pipeline {
namespace {

using Key = std::tuple<int, int, int>;  // an action: (kind, stage, microbatch)

Key KeyOf(ActionKind kind, int stage, int microbatch) { return {static_cast<int>(kind), stage, microbatch}; }
Key KeyOf(const Action& action) { return KeyOf(action.kind, action.stage, action.microbatch); }

double CostOf(const Action& action, const CostModel& costs) {
  switch (action.kind) {
    case ActionKind::kForward: return costs.forward;
    case ActionKind::kBackward: return costs.backward;
    case ActionKind::kBackwardInput: return costs.backward_input;
    case ActionKind::kBackwardWeight: return costs.backward_weight;
    default: return 0.0;
  }
}

// The duration of action `index` of rank `rank`: measured when `costs` has per-action times.
double CostAt(const Schedule& schedule, const CostModel& costs, int rank, size_t index) {
  return costs.per_action.empty() ? CostOf(schedule.ranks[rank][index], costs) : costs.per_action.at(rank).at(index);
}

// A finished run's makespan (the latest rank's finish) and bubble (1 - busy / (ranks * makespan)).
void SetMakespanAndBubble(SimulationResult& result) {
  double busy = 0.0;
  for (double finish : result.finish) result.makespan = std::max(result.makespan, finish);
  for (double b : result.busy) busy += b;
  const auto ranks = static_cast<double>(result.finish.size());
  result.bubble = result.makespan > 0 ? 1.0 - busy / (ranks * result.makespan) : 0.0;
}

std::string At(int rank, size_t index, const Action& action) {
  return fmt::format("rank {} step {} ({})", rank, index, action.ToString());
}

// Where each action sits, and which rank sends and receives each message.
struct Placed {
  std::map<Key, std::pair<int, size_t>> where;  // action -> (rank, index)
  std::map<Message, int> sends, recvs;          // message -> rank
};

// Each action on its stage's rank, in range, once.
std::string PlacementProblem(const Schedule& schedule, Placed& placed) {
  const auto& shape = schedule.shape;
  for (int rank = 0; rank < shape.ranks; ++rank) {
    for (size_t i = 0; i < schedule.ranks[rank].size(); ++i) {
      const Action& a = schedule.ranks[rank][i];
      if (a.stage < 0 || a.stage >= shape.stages() || a.microbatch < 0 || a.microbatch >= shape.microbatches) {
        return fmt::format("{}: stage or microbatch out of range ({} stages, {} microbatches)", At(rank, i, a),
                           shape.stages(), shape.microbatches);
      }
      if (shape.RankOfStage(a.stage) != rank) {
        return fmt::format("{}: stage {} runs on rank {}", At(rank, i, a), a.stage, shape.RankOfStage(a.stage));
      }
      auto [previous, inserted] = placed.where.emplace(KeyOf(a), std::make_pair(rank, i));
      if (!inserted) return fmt::format("{}: repeated (first at step {})", At(rank, i, a), previous->second.second);
      if (a.IsSend()) placed.sends[MessageOf(a)] = rank;
      if (a.IsRecv()) placed.recvs[MessageOf(a)] = rank;
    }
  }
  return "";
}

// Every stage's microbatches forwarded and backwarded (whole or split, not both), in order.
std::string CompletenessProblem(const PipelineShape& shape, const Placed& placed) {
  auto index_of = [&](ActionKind kind, int stage, int mb) -> std::optional<size_t> {
    auto found = placed.where.find(KeyOf(kind, stage, mb));
    if (found == placed.where.end()) return std::nullopt;
    return found->second.second;
  };
  for (int stage = 0; stage < shape.stages(); ++stage) {
    const int rank = shape.RankOfStage(stage);
    for (int mb = 0; mb < shape.microbatches; ++mb) {
      const Action forward{ActionKind::kForward, stage, mb};
      auto f = index_of(ActionKind::kForward, stage, mb);
      auto b = index_of(ActionKind::kBackward, stage, mb);
      auto i = index_of(ActionKind::kBackwardInput, stage, mb);
      auto w = index_of(ActionKind::kBackwardWeight, stage, mb);
      if (!f) return fmt::format("rank {}: missing {}", rank, forward.ToString());
      if (!b && !(i && w)) {
        return fmt::format("rank {}: missing {} (or both {} and {})", rank, Action{ActionKind::kBackward, stage, mb}.ToString(),
                           Action{ActionKind::kBackwardInput, stage, mb}.ToString(),
                           Action{ActionKind::kBackwardWeight, stage, mb}.ToString());
      }
      if (b && (i || w)) return fmt::format("rank {}: {} is done both whole and split", rank, forward.ToString());
      const size_t backward_index = b ? *b : *i;
      if (backward_index < *f) {
        return fmt::format("rank {} step {}: backward of stage {} microbatch {} comes before its forward (step {})",
                           rank, backward_index, stage, mb, *f);
      }
      if (i && w && *w < *i) {
        return fmt::format("rank {} step {}: weight gradient of stage {} microbatch {} comes before its input "
                           "gradient (step {})", rank, *w, stage, mb, *i);
      }
    }
  }
  return "";
}

// Every send received and every receive sent.
std::string MessagePairProblem(const Placed& placed) {
  for (const auto& [message, rank] : placed.sends) {
    if (!placed.recvs.count(message)) {
      const bool activation = message.direction == Direction::kActivation;
      return fmt::format("rank {}: a send of stage {}'s {} for microbatch {} has no matching receive", rank,
                         message.FromStage(), activation ? "activation" : "gradient", message.microbatch);
    }
  }
  for (const auto& [message, rank] : placed.recvs) {
    if (!placed.sends.count(message)) {
      const bool activation = message.direction == Direction::kActivation;
      return fmt::format("rank {}: a receive of stage {}'s {} for microbatch {} has no matching send", rank,
                         message.stage, activation ? "input" : "output gradient", message.microbatch);
    }
  }
  return "";
}

// Checks that need no execution: placement, ranges, duplicates, completeness, message pairs
// and same-rank ordering. Returns "" or the first problem, in the order the rules are listed.
std::string CheckStatically(const Schedule& schedule) {
  if (static_cast<int>(schedule.ranks.size()) != schedule.shape.ranks) {
    return fmt::format("schedule has {} rank lists for {} ranks", schedule.ranks.size(), schedule.shape.ranks);
  }
  Placed placed;
  std::string problem = PlacementProblem(schedule, placed);
  if (problem.empty()) problem = CompletenessProblem(schedule.shape, placed);
  if (problem.empty()) problem = MessagePairProblem(placed);
  return problem;
}

// Lockstep execution state.
class Lockstep {
 public:
  Lockstep(const Schedule& schedule, SendSemantics semantics, const CostModel& costs)
      : schedule_(schedule), semantics_(semantics), costs_(costs), shape_(schedule.shape),
        next_(shape_.ranks, 0), clock_(shape_.ranks, 0.0), in_flight_(shape_.ranks, 0) {
    result_.busy.assign(shape_.ranks, 0.0);
    result_.peak_in_flight.assign(shape_.ranks, 0);
    result_.start_times.resize(shape_.ranks);
    for (int r = 0; r < shape_.ranks; ++r) result_.start_times[r].assign(schedule.ranks[r].size(), 0.0);
    grid_.resize(shape_.ranks);
  }

  SimulationResult Run() {
    std::vector<int> ready;
    std::vector<char> moves(shape_.ranks, 0);  // by rank: a lookup, not a search (64 ranks, 2048 microbatches)
    while (!Finished()) {
      ready.clear();
      for (int r = 0; r < shape_.ranks; ++r) {
        moves[r] = next_[r] < schedule_.ranks[r].size() && ReadyTime(r, schedule_.ranks[r][next_[r]]);
        if (moves[r]) ready.push_back(r);
      }
      if (ready.empty()) return Fail("deadlock: no rank can take its next step");
      for (int r = 0; r < shape_.ranks; ++r) {
        grid_[r].push_back(moves[r] ? schedule_.ranks[r][next_[r]].ToString()
                                    : (next_[r] < schedule_.ranks[r].size() ? "." : ""));
      }
      for (int r : ready) Execute(r);
    }
    result_.ok = true;
    result_.finish.assign(clock_.begin(), clock_.end());
    SetMakespanAndBubble(result_);
    result_.grid = Grid(-1);
    return result_;
  }

 private:
  bool Finished() const {
    for (int r = 0; r < shape_.ranks; ++r) {
      if (next_[r] < schedule_.ranks[r].size()) return false;
    }
    return true;
  }

  // When rank r's next action may start, or nothing if it must wait.
  std::optional<double> ReadyTime(int r, const Action& a) const {
    const int s = a.stage, mb = a.microbatch;
    auto done = [&](ActionKind kind, int stage) -> std::optional<double> {
      auto found = finished_.find(KeyOf(kind, stage, mb));
      if (found == finished_.end()) return std::nullopt;
      return found->second;
    };
    auto arrived = [&](Direction direction) -> std::optional<double> {
      const Message message{direction, s, mb};
      if (!posted_.count(message)) return std::nullopt;
      auto sent = sent_.find(message);
      if (sent == sent_.end()) return std::nullopt;
      return std::max(clock_[r], sent->second);
    };
    auto backward_done = [&](int stage) {
      auto whole = done(ActionKind::kBackward, stage);
      return whole ? whole : done(ActionKind::kBackwardInput, stage);
    };
    switch (a.kind) {
      case ActionKind::kForward: {
        if (s == 0) return clock_[r];
        auto input = shape_.RankOfStage(s - 1) == r ? done(ActionKind::kForward, s - 1) : arrived(Direction::kActivation);
        if (!input) return std::nullopt;
        return std::max(clock_[r], *input);
      }
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput: {
        if (!done(ActionKind::kForward, s)) return std::nullopt;
        if (s + 1 == shape_.stages()) return clock_[r];
        auto gradient = shape_.RankOfStage(s + 1) == r ? backward_done(s + 1) : arrived(Direction::kGradient);
        if (!gradient) return std::nullopt;
        return std::max(clock_[r], *gradient);
      }
      case ActionKind::kBackwardWeight:
        return done(ActionKind::kBackwardInput, s) ? std::optional<double>(clock_[r]) : std::nullopt;
      case ActionKind::kSendForward:
      case ActionKind::kSendBackward: {
        const bool produced = a.kind == ActionKind::kSendForward ? done(ActionKind::kForward, s).has_value()
                                                                 : backward_done(s).has_value();
        if (!produced) return std::nullopt;
        if (semantics_ == SendSemantics::kBuffered) return clock_[r];
        auto receiver = posted_.find(MessageOf(a));
        if (receiver == posted_.end()) return std::nullopt;
        return std::max(clock_[r], receiver->second);
      }
      default:
        return clock_[r];  // posting a receive never waits
    }
  }

  void Execute(int r) {
    const Action& a = schedule_.ranks[r][next_[r]];
    const double start = *ReadyTime(r, a);
    const double end = start + CostAt(schedule_, costs_, r, next_[r]);
    result_.start_times[r][next_[r]] = start;
    clock_[r] = end;
    if (a.IsCompute()) {
      result_.busy[r] += end - start;
      finished_[KeyOf(a)] = end;
      if (a.kind == ActionKind::kForward) ++in_flight_[r];
      if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --in_flight_[r];
      result_.peak_in_flight[r] = std::max(result_.peak_in_flight[r], in_flight_[r]);
    } else if (a.IsSend()) {
      sent_[MessageOf(a)] = end;
    } else {
      posted_[MessageOf(a)] = end;
    }
    ++next_[r];
  }

  // The grid of lockstep steps; with `failed` >= 0 a last column marks each rank's stuck action.
  std::string Grid(int failed) const {
    size_t width = 4;
    for (const auto& row : grid_) {
      for (const auto& cell : row) width = std::max(width, cell.size() + 1);
    }
    for (int r = 0; r < shape_.ranks; ++r) {
      if (next_[r] < schedule_.ranks[r].size()) width = std::max(width, schedule_.ranks[r][next_[r]].ToString().size() + 3);
    }
    const size_t steps = grid_.empty() ? 0 : grid_[0].size();
    std::string text = fmt::format("{:<8}", "step");
    for (size_t i = 0; i < steps; ++i) text += fmt::format("{:>{}}", i, width);
    if (failed >= 0) text += fmt::format("{:>{}}", fmt::format("{}", steps), width);
    text += "\n";
    for (int r = 0; r < shape_.ranks; ++r) {
      text += fmt::format("{:<8}", fmt::format("rank {}", r));
      for (const auto& cell : grid_[r]) text += fmt::format("{:>{}}", cell, width);
      if (failed >= 0) {
        const bool stuck = next_[r] < schedule_.ranks[r].size();
        // One format rather than ">" + text + "<": GCC 12 inlines that concatenation into a memcpy
        // whose bound it cannot prove (-Wstringop-overflow, a false positive).
        const std::string mark = stuck ? fmt::format(">{}<", schedule_.ranks[r][next_[r]].ToString()) : "done";
        text += fmt::format("{:>{}}", mark, width);
      }
      text += "\n";
    }
    if (failed >= 0) text += "(>X< marks the action each rank is stuck on)\n";
    return text;
  }

  SimulationResult Fail(const std::string& why) {
    result_.ok = false;
    result_.stuck_at = next_;
    result_.grid = Grid(1);
    std::vector<std::string> stuck;
    for (int r = 0; r < shape_.ranks; ++r) {
      if (next_[r] < schedule_.ranks[r].size()) stuck.push_back(At(r, next_[r], schedule_.ranks[r][next_[r]]));
    }
    result_.error = fmt::format("{} at lockstep step {}; waiting: {}\n{}", why, grid_.empty() ? 0 : grid_[0].size(),
                                fmt::join(stuck, ", "), result_.grid);
    return result_;
  }

  const Schedule& schedule_;
  SendSemantics semantics_;
  CostModel costs_;
  PipelineShape shape_;
  std::vector<size_t> next_;
  std::vector<double> clock_;
  std::vector<int> in_flight_;
  std::map<Key, double> finished_;  // compute action -> end time
  std::map<Message, double> sent_;    // message -> send time
  std::map<Message, double> posted_;  // message -> receive posted time
  std::vector<std::vector<std::string>> grid_;
  SimulationResult result_;
};

// NCCL's device streams (SendSemantics::kDeviceStreams): every time is computed once all it
// depends on is known, over and over until nothing changes; what stays unknown is deadlocked.
class DeviceStreams {
 public:
  DeviceStreams(const Schedule& schedule, const CostModel& costs) : schedule_(schedule), costs_(costs) {
    const auto& shape = schedule.shape;
    std::map<Message, std::pair<int, size_t>> sender, receiver;  // message -> (rank, index) of each end
    for (int r = 0; r < shape.ranks; ++r) {
      start_.emplace_back(schedule.ranks[r].size(), std::nullopt);
      done_.emplace_back(schedule.ranks[r].size(), std::nullopt);
      other_end_.emplace_back(schedule.ranks[r].size(), std::make_pair(-1, size_t{0}));
      for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
        const Action& a = schedule.ranks[r][i];
        if (a.IsSend()) sender[MessageOf(a)] = {r, i};
        if (a.IsRecv()) receiver[MessageOf(a)] = {r, i};
      }
    }
    // Each compute action's receive, found once: Pass runs over the lists many times.
    for (int r = 0; r < shape.ranks; ++r) {
      input_of_.emplace_back(schedule.ranks[r].size(), std::nullopt);
      for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
        const auto message = InputMessage(shape, schedule.ranks[r][i]);
        if (!message) continue;
        const auto found = receiver.find(*message);
        if (found != receiver.end() && found->second.first == r) input_of_[r][i] = found->second.second;
      }
    }
    for (const auto& [message, send] : sender) {
      const auto receive = receiver.find(message);
      if (receive == receiver.end()) continue;  // CheckStatically reports it
      other_end_[send.first][send.second] = receive->second;
      other_end_[receive->second.first][receive->second.second] = send;
    }
  }

  SimulationResult Run() {
    while (Pass()) {
    }
    SimulationResult result;
    const auto& shape = schedule_.shape;
    result.busy.assign(shape.ranks, 0.0);
    result.finish.assign(shape.ranks, 0.0);
    result.peak_in_flight.assign(shape.ranks, 0);
    result.start_times.resize(shape.ranks);
    std::vector<std::string> stuck;
    for (int r = 0; r < shape.ranks; ++r) {
      const auto& actions = schedule_.ranks[r];
      result.start_times[r].assign(actions.size(), 0.0);
      int in_flight = 0;
      bool reported = false;
      for (size_t i = 0; i < actions.size(); ++i) {
        const Action& a = actions[i];
        if (!start_[r][i] || (!a.IsCompute() && !done_[r][i])) {
          if (!reported) stuck.push_back(Waiting(r, i));
          reported = true;
          continue;
        }
        result.start_times[r][i] = *start_[r][i];
        if (!a.IsCompute()) {
          result.finish[r] = std::max(result.finish[r], *done_[r][i]);
          continue;
        }
        const double cost = CostAt(schedule_, costs_, r, i);
        result.busy[r] += cost;
        result.finish[r] = std::max(result.finish[r], *start_[r][i] + cost);
        if (a.kind == ActionKind::kForward) ++in_flight;
        if (a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight) --in_flight;
        result.peak_in_flight[r] = std::max(result.peak_in_flight[r], in_flight);
      }
    }
    if (!stuck.empty()) {
      result.error = fmt::format("deadlock on the device streams (NCCL: a send or receive holds its channel's stream "
                                 "until the other end has started): {}",
                                 fmt::join(stuck, "; "));
      return result;
    }
    result.ok = true;
    SetMakespanAndBubble(result);
    return result;
  }

 private:
  // A rank's walk down its list, kept between passes: each pass resumes where the last one
  // stopped, so a long schedule costs one walk, not one walk per message (64 ranks with 2048
  // microbatches took minutes).
  struct Walk {
    size_t next = 0;        // the first action not yet issued
    double frontier = 0.0;  // the compute stream is done with everything issued so far
    std::map<std::pair<int, bool>, size_t> channel_last;  // (peer, sends?) -> its last message so far
    std::map<std::pair<int, bool>, size_t> last_send;     // (peer, forward?) -> the last send
    // Issued messages waiting for their channel's previous one: (index, frontier when issued, previous).
    std::vector<std::tuple<size_t, double, size_t>> queued;
    std::vector<size_t> started;  // messages started whose other end may not have
  };

  // One pass over every rank; true when some time became known: one step of a fixed-point
  // iteration over the stream model (simulator.h, kDeviceStreams). Each rank starts the messages
  // queued behind a finished one, then walks on down its list; then every message whose two ends
  // have started is done.
  bool Pass() {
    if (walks_.empty()) walks_.resize(schedule_.shape.ranks);
    bool changed = false;
    for (int r = 0; r < schedule_.shape.ranks; ++r) {
      changed = StartQueued(r) || changed;
      changed = WalkOn(r) || changed;
    }
    return FinishMessages() || changed;
  }

  // Sets a time not known yet; true when it was not.
  static bool Learn(std::optional<double>& slot, double value) {
    if (slot) return false;
    slot = value;
    return true;
  }

  // Messages queued behind their channel's previous one start once it is done.
  bool StartQueued(int r) {
    bool changed = false;
    Walk& walk = walks_[r];
    for (auto it = walk.queued.begin(); it != walk.queued.end();) {
      const auto [index, frontier, before] = *it;
      if (!done_[r][before]) {
        ++it;
        continue;
      }
      changed = Learn(start_[r][index], std::max(frontier, *done_[r][before])) || changed;
      walk.started.push_back(index);
      it = walk.queued.erase(it);
    }
    return changed;
  }

  // Rank r's walk down its list from where it stopped, until an action waits on an unknown time.
  bool WalkOn(int r) {
    bool changed = false;
    const auto& actions = schedule_.ranks[r];
    Walk& walk = walks_[r];
    for (; walk.next < actions.size(); ++walk.next) {
      const size_t i = walk.next;
      const Action& a = actions[i];
      if (a.IsCompute()) {
        double ready = walk.frontier;
        const auto input = InputOf(r, i);
        if (input) {
          if (!done_[r][*input]) break;  // the compute stream stops here, and everything after it
          ready = std::max(ready, *done_[r][*input]);
        }
        changed = Learn(start_[r][i], ready) || changed;
        walk.frontier = ready + CostAt(schedule_, costs_, r, i);
        continue;
      }
      const int peer = PeerOf(schedule_.shape, a);
      if (a.IsSend()) {
        // The executor waits for the previous message to the same peer and direction before it
        // sends the next: on a GPU the compute stream waits for that send's end.
        const std::pair<int, bool> key{peer, a.kind == ActionKind::kSendForward};
        const auto previous = walk.last_send.find(key);
        if (previous != walk.last_send.end()) {
          if (!done_[r][previous->second]) break;
          walk.frontier = std::max(walk.frontier, *done_[r][previous->second]);
        }
        walk.last_send[key] = i;
      }
      // Issued now: its channel's stream takes it once the compute stream has done everything
      // issued before it and the channel's previous message is done.
      const std::pair<int, bool> channel{peer, a.IsSend()};
      const auto last = walk.channel_last.find(channel);
      const std::optional<size_t> before =
          last == walk.channel_last.end() ? std::nullopt : std::optional<size_t>(last->second);
      walk.channel_last[channel] = i;
      if (before && !done_[r][*before]) {
        walk.queued.emplace_back(i, walk.frontier, *before);  // later messages on this channel wait; others do not
        continue;
      }
      changed = Learn(start_[r][i], before ? std::max(walk.frontier, *done_[r][*before]) : walk.frontier) || changed;
      walk.started.push_back(i);
    }
    return changed;
  }

  // A message is done once both its ends have started.
  bool FinishMessages() {
    bool changed = false;
    for (int r = 0; r < schedule_.shape.ranks; ++r) {
      auto& started = walks_[r].started;
      for (auto it = started.begin(); it != started.end();) {
        const auto& [peer, index] = other_end_[r][*it];
        if (peer < 0 || done_[r][*it]) {
          it = started.erase(it);
          continue;
        }
        if (!start_[peer][index]) {
          ++it;
          continue;
        }
        changed = Learn(done_[r][*it], std::max(*start_[r][*it], *start_[peer][index])) || changed;
        it = started.erase(it);
      }
    }
    return changed;
  }

  // The index of the receive whose message compute action (r, i) takes; none for a local input.
  std::optional<size_t> InputOf(int r, size_t i) const { return input_of_[r][i]; }

  // What rank r's first unfinished action (index i) waits for.
  std::string Waiting(int r, size_t i) const {
    const Action& a = schedule_.ranks[r][i];
    if (a.IsCompute()) {
      const auto input = InputOf(r, i);
      if (!start_[r][i] && input && !done_[r][*input]) {
        return fmt::format("{} waits for {}", At(r, i, a), At(r, *input, schedule_.ranks[r][*input]));
      }
      return fmt::format("{} waits behind its rank's compute stream", At(r, i, a));
    }
    if (!start_[r][i]) {
      // The latest earlier send to the same peer and direction (the executor waits for it), else
      // the message before it on its channel.
      const auto& actions = schedule_.ranks[r];
      const int peer = PeerOf(schedule_.shape, a);
      for (size_t j = i; j-- > 0;) {
        const Action& b = actions[j];
        if (a.IsSend() && b.kind == a.kind && PeerOf(schedule_.shape, b) == peer && !done_[r][j]) {
          return fmt::format("{} waits for the send before it, {}, to end", At(r, i, a), At(r, j, b));
        }
        if (!b.IsCompute() && b.IsSend() == a.IsSend() && PeerOf(schedule_.shape, b) == peer) {
          return fmt::format("{} waits for {} before it on its channel", At(r, i, a), At(r, j, b));
        }
      }
      return fmt::format("{} waits behind its rank's compute stream", At(r, i, a));
    }
    const auto& [peer, index] = other_end_[r][i];
    return fmt::format("{} has started; its other end {} has not", At(r, i, a),
                       At(peer, index, schedule_.ranks[peer][index]));
  }

  const Schedule& schedule_;
  CostModel costs_;
  std::vector<std::vector<std::optional<double>>> start_, done_;  // [rank][index]
  std::vector<std::vector<std::pair<int, size_t>>> other_end_;    // [rank][index]: (rank, index), -1 for compute
  std::vector<std::vector<std::optional<size_t>>> input_of_;      // [rank][index]: its receive's index
  std::vector<Walk> walks_;                                        // [rank], between passes
};

std::atomic<int64_t> g_simulations{0};
std::atomic<int64_t> g_validations{0};

}  // namespace

int64_t SimulationsRun() { return g_simulations.load(); }
int64_t ValidationsRun() { return g_validations.load(); }

SimulationResult Simulate(const Schedule& schedule, SendSemantics semantics, const CostModel& costs) {
  ++g_simulations;
  const std::string problem = CheckStatically(schedule);
  if (!problem.empty()) {
    SimulationResult result;
    result.error = problem;
    return result;
  }
  if (semantics == SendSemantics::kDeviceStreams) return DeviceStreams(schedule, costs).Run();
  return Lockstep(schedule, semantics, costs).Run();
}

std::string MessageOrderProblem(const Schedule& schedule) {
  const auto& shape = schedule.shape;
  for (int to = 0; to < shape.ranks; ++to) {
    for (int from = 0; from < shape.ranks; ++from) {
      if (from == to) continue;
      const std::vector<Action> sent = ReceivesInSendOrder(schedule, from, to);
      const std::vector<Action> posted = ReceivesPosted(schedule, from, to);
      for (size_t k = 0; k < std::min(sent.size(), posted.size()); ++k) {
        if (sent[k] == posted[k]) continue;
        return fmt::format("rank {} posts its receive #{} from rank {} for {}, but rank {}'s message #{} to it is for "
                           "{}: messages between two ranks are matched by order (transport discipline)",
                           to, k + 1, from, posted[k].ToString(), from, k + 1, sent[k].ToString());
      }
    }
  }
  return "";
}

SimulationResult ValidateSchedule(const Schedule& schedule, const CostModel& costs, CommunicationModel model) {
  ++g_validations;
  const auto invalid = [&](const std::string& how, const std::string& why) {
    return ScheduleError(fmt::format("schedule {} ({} ranks, {} microbatches) is invalid{}: {}", schedule.name,
                                     schedule.shape.ranks, schedule.shape.microbatches, how, why));
  };
  const auto rendezvous = Simulate(schedule, SendSemantics::kRendezvous, costs);
  if (!rendezvous.ok) throw invalid(" when sends wait for receives", rendezvous.error);
  auto result = Simulate(schedule, SendSemantics::kBuffered, costs);
  if (!result.ok) throw invalid("", result.error);
  const std::string order = MessageOrderProblem(schedule);
  if (!order.empty()) throw invalid("", order);
  if (model == CommunicationModel::kDeviceStreams) {
    const auto streams = Simulate(schedule, SendSemantics::kDeviceStreams, costs);
    if (!streams.ok) throw invalid(" on device streams", streams.error);
  }
  return result;
}

std::optional<double> PublishedMakespan(const std::string& schedule_name, const PipelineShape& shape,
                                        const CostModel& costs, std::string* formula) {
  const double p = shape.ranks, m = shape.microbatches, v = shape.virtual_stages;
  const double f = costs.forward, b = costs.backward, i = costs.backward_input, w = costs.backward_weight;
  std::string text;
  std::optional<double> makespan;
  if (schedule_name == "gpipe" || schedule_name == "1f1b") {
    makespan = (m + p - 1) * (f + b);
    text = fmt::format("(m + p - 1)(F + B) = ({:g} + {:g} - 1)({:g} + {:g})", m, p, f, b);
  } else if (schedule_name == "interleaved") {
    makespan = (v * m + p - 1) * (f + b);
    text = fmt::format("(v m + p - 1)(F + B) = ({:g} x {:g} + {:g} - 1)({:g} + {:g})", v, m, p, f, b);
  } else if (schedule_name == "zbh1") {
    makespan = m * (f + i + w) + (p - 1) * (f + i - w);
    text = fmt::format("m(F + I + W) + (p - 1)(F + I - W) = {:g}({:g} + {:g} + {:g}) + ({:g} - 1)({:g} + {:g} - {:g})",
                       m, f, i, w, p, f, i, w);
  } else if (schedule_name == "dualpipev") {
    // Per rank, two stages' work plus DeepSeek's bubble for DualPipe(V), (p/2 - 1)(F&B + B - 3W),
    // where F&B is a forward and a whole backward of the rank's two stages overlapped; pipecheck
    // runs the pair one after the other, so F&B = F + B here.
    const double pair = f + i + w, whole = i + w;
    makespan = 2 * m * (f + whole) + (p / 2 - 1) * (pair + whole - 3 * w);
    text = fmt::format("2m(F + B) + (p/2 - 1)(F&B + B - 3W), F&B = F + B = 2 x {:g}({:g} + {:g}) + ({:g}/2 - 1)({:g} + "
                       "{:g} - 3 x {:g})", m, f, whole, p, pair, whole, w);
  }
  if (makespan && formula) *formula = fmt::format("{} = {:g}", text, *makespan);
  return makespan;
}

std::string FormatTimeline(const Schedule& schedule, const SimulationResult& result, const CostModel& costs) {
  // Cells of the smallest cost among the actions present; each compute action fills its span.
  double unit = 0.0;
  for (const auto& actions : schedule.ranks) {
    for (const auto& a : actions) {
      if (a.IsCompute() && CostOf(a, costs) > 0) unit = unit > 0 ? std::min(unit, CostOf(a, costs)) : CostOf(a, costs);
    }
  }
  if (unit <= 0) unit = 1.0;
  const int columns = static_cast<int>(std::ceil(result.makespan / unit - 1e-9));
  std::vector<std::vector<std::string>> rows(schedule.ranks.size(), std::vector<std::string>(columns, "."));
  size_t width = 3;
  for (size_t r = 0; r < schedule.ranks.size(); ++r) {
    for (size_t i = 0; i < schedule.ranks[r].size(); ++i) {
      const Action& a = schedule.ranks[r][i];
      if (!a.IsCompute()) continue;
      const int first = static_cast<int>(std::lround(result.start_times[r][i] / unit));
      const int span = static_cast<int>(std::lround(CostOf(a, costs) / unit));
      // "F3"; with several stages per rank, the stage too ("5F3").
      const std::string label = schedule.shape.virtual_stages > 1 ? a.ToString()
                                                                  : a.ToString().substr(std::to_string(a.stage).size());
      width = std::max(width, label.size() + 1);
      for (int c = first; c < first + span && c < columns; ++c) rows[r][c] = label;
    }
  }
  std::string text;
  for (size_t r = 0; r < rows.size(); ++r) {
    text += fmt::format("rank {:<3}", r);
    for (const auto& cell : rows[r]) text += fmt::format("{:>{}}", cell, width);
    text += "\n";
  }
  return text;
}

}  // namespace pipecheck::pipeline
