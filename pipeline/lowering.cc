// The lowering passes (see lowering.h).
#include "pipeline/lowering.h"

#include <algorithm>
#include <map>

#include "pipeline/message.h"
#include "pipeline/simulator.h"

namespace pipecheck::pipeline {
namespace {

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

Schedule AddCommunication(const Schedule& schedule, bool post_receives_first) {
  const auto& shape = schedule.shape;
  Schedule lowered{schedule.name, shape, std::vector<std::vector<Action>>(shape.ranks)};
  for (int rank = 0; rank < shape.ranks; ++rank) {
    auto& out = lowered.ranks[rank];
    for (const Action& action : schedule.ranks[rank]) {
      if (const auto input = InputMessage(shape, action)) out.push_back(input->Receive());
      out.push_back(action);
      if (const auto output = OutputMessage(shape, action)) out.push_back(output->Send());
    }
    if (post_receives_first) PostReceivesEarly(out);
  }
  return lowered;
}

namespace {

// PostReceivesWhereNeeded, giving up (false) once its simulations have walked more than
// `budget` actions in all (a negative budget: no limit).
bool PostReceivesWithin(Schedule& lowered, int64_t budget) {
  int64_t actions = 0;
  for (const auto& list : lowered.ranks) actions += static_cast<int64_t>(list.size());
  size_t receives = 0;
  for (const auto& actions : lowered.ranks) receives += std::count_if(actions.begin(), actions.end(),
                                                                       [](const Action& a) { return a.IsRecv(); });
  // Each round posts at least one receive earlier, so there are at most `receives` rounds.
  int64_t walked = 0;
  for (size_t round = 0; round <= receives; ++round) {
    walked += actions;
    if (budget >= 0 && walked > budget) return false;
    const SimulationResult result = Simulate(lowered, SendSemantics::kRendezvous);
    if (result.ok || result.stuck_at.empty()) return true;
    bool moved = false;
    for (int r = 0; r < lowered.shape.ranks; ++r) {
      const size_t at = result.stuck_at[r];
      if (at >= lowered.ranks[r].size() || !lowered.ranks[r][at].IsSend()) continue;
      const Action& send = lowered.ranks[r][at];
      const Message message = MessageOf(send);
      const Action receive = message.Receive();
      const int peer = ReceiverRank(lowered.shape, message);
      auto& theirs = lowered.ranks[peer];
      const size_t here = result.stuck_at[peer];
      const auto found = std::find(theirs.begin() + static_cast<std::ptrdiff_t>(std::min(here, theirs.size())),
                                   theirs.end(), receive);
      if (found == theirs.end() || static_cast<size_t>(found - theirs.begin()) == here) continue;
      // Post it where the peer is stuck: before whatever it is waiting on.
      const Action moving = *found;
      theirs.erase(found);
      theirs.insert(theirs.begin() + static_cast<std::ptrdiff_t>(here), moving);
      moved = true;
      break;  // one at a time: the peer's position has changed
    }
    if (!moved) return true;
  }
  return true;
}

}  // namespace

Schedule PostReceivesWhereNeeded(Schedule lowered) {
  PostReceivesWithin(lowered, -1);
  return lowered;
}

Schedule OrderReceivesAsSent(Schedule lowered) {
  const auto& shape = lowered.shape;
  for (int to = 0; to < shape.ranks; ++to) {
    for (int from = 0; from < shape.ranks; ++from) {
      if (from == to) continue;
      auto& actions = lowered.ranks[to];
      const std::vector<Action> sent = ReceivesInSendOrder(lowered, from, to);
      if (sent.empty()) continue;
      // Where each of them is posted now (looked up, not searched: long schedules have thousands
      // of receives per rank); then the k-th may go no later than the (k+1)-th.
      std::map<Action, size_t> position;
      for (size_t i = 0; i < actions.size(); ++i) {
        if (actions[i].IsRecv()) position.emplace(actions[i], i);
      }
      std::vector<size_t> at(sent.size(), actions.size());
      for (size_t k = 0; k < sent.size(); ++k) {
        const auto found = position.find(sent[k]);
        if (found != position.end()) at[k] = found->second;
      }
      if (std::find(at.begin(), at.end(), actions.size()) != at.end()) continue;  // a missing receive: reported later
      for (size_t k = sent.size(); k-- > 1;) at[k - 1] = std::min(at[k - 1], at[k]);
      std::vector<std::vector<Action>> posted_at(actions.size());
      for (size_t k = 0; k < sent.size(); ++k) posted_at[at[k]].push_back(sent[k]);
      std::vector<Action> reordered;
      reordered.reserve(actions.size());
      for (size_t i = 0; i < actions.size(); ++i) {
        const bool ours = actions[i].IsRecv() && SenderRank(shape, MessageOf(actions[i])) == from;
        if (!ours) {
          reordered.push_back(actions[i]);
          continue;
        }
        for (const Action& receive : posted_at[i]) reordered.push_back(receive);
      }
      actions = std::move(reordered);
    }
  }
  return lowered;
}

Schedule LowerSchedule(const Schedule& compute, bool post_receives_first) {
  Schedule lowered = AddCommunication(compute, post_receives_first);
  return post_receives_first ? OrderReceivesAsSent(PostReceivesWhereNeeded(std::move(lowered))) : lowered;
}

std::optional<Schedule> LowerScheduleWithin(const Schedule& compute, int64_t budget, bool post_receives_first) {
  Schedule lowered = AddCommunication(compute, post_receives_first);
  if (!post_receives_first) return lowered;
  if (!PostReceivesWithin(lowered, budget)) return std::nullopt;
  return OrderReceivesAsSent(std::move(lowered));
}

}  // namespace pipecheck::pipeline
