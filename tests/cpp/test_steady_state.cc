// Tests of the steady state's logic (csrc/coordinator/steady_state.*) as pure
// logic: the coordinator learning a schedule from the responses it decides
// (requests in through Add(), the announcement out of Drain()), the ranks'
// ready/exit tally, and the messages that carry both. No sockets, no threads,
// no wall time. Prints "N passed, M failed".
#include <cstring>
#include <memory>

#include "coord_test_util.h"
#include "coordinator/coordinator.h"
#include "coordinator/steady_state.h"

using namespace hvdlite;
using namespace coordtest;

namespace {

struct Harness {
  Config cfg;
  ProcessSetTable sets;
  std::unique_ptr<Coordinator> coord;
  int world;

  explicit Harness(int w, bool steady = true) : world(w) {
    cfg.STEADY_STATE = steady;
    sets.Reset(w);
    coord.reset(new Coordinator(cfg, &sets, w, nullptr));
  }
  void SubmitAll(const Request& r) {
    for (int rank = 0; rank < world; ++rank) {
      RequestList list;
      list.requests.push_back(r);
      list.requests.back().rank = rank;
      coord->Add(rank, list);
    }
  }
  // One training step: `names` submitted by every rank, one at a time, then drained.
  std::vector<ResponseList> Step(const std::vector<std::string>& names) {
    for (const auto& n : names) SubmitAll(Allreduce(n, 0));
    std::vector<ResponseList> out;
    coord->Drain(&out);
    return out;
  }
};

// Steps until a schedule is announced (at most `limit`); returns the step, or -1.
int StepsUntilSchedule(Harness& h, const std::vector<std::string>& names, int limit,
                       std::vector<ResponseList>* announced) {
  for (int step = 0; step < limit; ++step) {
    *announced = h.Step(names);
    if (!announced->empty() && !(*announced)[0].schedule.empty()) return step;
  }
  return -1;
}

void TestLearnsAndAnnouncesToEveryRank() {
  Harness h(3);
  std::vector<ResponseList> lists;
  const int step = StepsUntilSchedule(h, {"a", "b"}, 10, &lists);
  // Step 0 binds nothing (first sighting), steps 1 and 2 are the same cached period.
  Check(step == 2, "announced at step 2, got " + std::to_string(step));
  if (step < 0) return;
  for (const auto& l : lists) {
    Check(l.schedule_epoch == 1, "epoch 1");
    Check(l.schedule.size() == 1 && l.schedule[0].names.size() == 2, "one fused group of two");
    Check(l.schedule[0].cache_ids[0] >= 0 && l.schedule[0].cache_ids[1] >= 0, "cached ids");
    Check(!l.responses.empty(), "announced after this Drain's responses");
  }
  // Nothing more is announced until rank 0 leaves the schedule.
  Check(StepsUntilSchedule(h, {"a", "b"}, 5, &lists) == -1, "no second announcement while active");
  h.coord->EndSchedule();
  const int again = StepsUntilSchedule(h, {"a", "b"}, 5, &lists);
  Check(again == 1, "re-learned in two steps after EndSchedule, got " + std::to_string(again));
  Check(again < 0 || lists[0].schedule_epoch == 2, "next epoch");
}

void TestNotAnnouncedWithWorkPending() {
  Harness h(2);
  std::vector<ResponseList> lists;
  for (int step = 0; step < 6; ++step) {
    h.SubmitAll(Allreduce("a", 0));
    RequestList early;  // rank 1 already submitted the next step's tensor
    early.requests.push_back(Allreduce("a2", 1));
    h.coord->Add(1, early);
    h.coord->Drain(&lists);
    Check(lists.empty() || lists[0].schedule.empty(), "no schedule while a request is undecided");
    RequestList late;
    late.requests.push_back(Allreduce("a2", 0));
    h.coord->Add(0, late);
    h.coord->Drain(&lists);
  }
}

void TestOtherResponsesRestartLearning() {
  Harness h(2);
  std::vector<ResponseList> lists;
  for (int step = 0; step < 8; ++step) {
    lists = h.Step({"a"});
    Check(lists.empty() || lists[0].schedule.empty() || step >= 2, "not before two cached periods");
    Request barrier = Allreduce("__barrier__", 0);
    barrier.type = OpType::kBarrier;
    h.SubmitAll(barrier);  // a barrier every step: nothing to replay
    h.coord->Drain(&lists);
    Check(lists.empty() || lists[0].schedule.empty(), "a barrier in the period: never announced");
  }
}

void TestSettingOff() {
  Harness h(2, /*steady=*/false);
  std::vector<ResponseList> lists;
  Check(StepsUntilSchedule(h, {"a", "b"}, 8, &lists) == -1, "HVDLITE_STEADY_STATE=0: never announced");
}

void TestLearnerPeriod() {
  ScheduleLearner learner;
  auto resp = [](const std::string& name, int32_t id) {
    Response r;
    r.names = {name};
    r.cache_ids = {id};
    return r;
  };
  std::vector<Response> period;
  for (int i = 0; i < 2; ++i) {
    learner.Observe(resp("x", 1), true);
    learner.Observe(resp("y", 2), true);
    learner.Observe(resp("z", 3), true);
  }
  Check(learner.Period(&period) && period.size() == 3 && period[0].names[0] == "x", "period of three");
  learner.Observe(resp("x", 1), false);  // a response not every rank received
  Check(!learner.Period(&period), "a non-global response restarts learning");
  learner.Observe(resp("x", 1), true);
  learner.Observe(resp("x", 1), true);
  Check(learner.Period(&period) && period.size() == 1, "period of one");
  learner.Observe(resp("y", -1), true);  // not cached: not replayable
  learner.Observe(resp("y", -1), true);
  Check(!learner.Period(&period), "uncached responses are never replayed");
  Response barrier;
  barrier.type = OpType::kBarrier;
  barrier.names = {"barrier.noname.0"};
  learner.Observe(resp("x", 1), true);
  learner.Observe(barrier, true);
  learner.Observe(resp("x", 1), true);
  Check(learner.Period(&period) && period.size() == 1 && period[0].names[0] == "x",
        "a barrier of the global set is skipped, not learned");
  barrier.process_set = 1;
  learner.Observe(barrier, true);
  Check(!learner.Period(&period), "a barrier of another set restarts learning");
}

Response Group(const std::vector<std::string>& names) {
  Response r;
  r.names = names;
  for (size_t i = 0; i < names.size(); ++i) r.cache_ids.push_back(static_cast<int32_t>(i));
  return r;
}

Vote V(int64_t epoch, int64_t position, bool ready) {
  Vote v;
  v.epoch = epoch;
  v.position = position;
  v.ready = ready;
  return v;
}

void TestVotes() {
  SteadySchedule s(/*rank=*/1, /*size=*/3);
  s.OnVote(0, V(1, 0, true));  // before this rank entered epoch 1: kept
  s.Enter(1, {Group({"a"}), Group({"b", "c"})});
  int32_t id = -1;
  size_t group = 9;
  Check(s.Find("c", &id, &group) && id == 1 && group == 1, "find c in group 1");
  Check(!s.Find("zz", &id, &group), "unknown name");
  Check(s.Decide() == SteadySchedule::Outcome::kWait, "waits for votes");
  s.VoteSelf(true);
  s.OnVote(2, V(1, 1, true));  // rank 2 is a position ahead? not possible yet, but kept
  Check(s.Decide() == SteadySchedule::Outcome::kWait, "rank 2 has not voted at 0");
  s.OnVote(2, V(1, 0, true));
  Check(s.Decide() == SteadySchedule::Outcome::kRun, "unanimous ready runs");
  s.Advance();
  Check(s.group_index() == 1 && s.Voted(2) && !s.Voted(1), "position 1: rank 2's early vote counts");
  s.OnVote(0, V(1, 1, false));
  s.OnVote(0, V(1, 1, true));  // a second vote of one rank is ignored
  s.VoteSelf(true);
  Check(s.Decide() == SteadySchedule::Outcome::kExit, "one exit: everyone leaves");
  s.Leave();
  s.OnVote(0, V(1, 2, true));  // an epoch that is over
  s.Enter(2, {Group({"a"})});
  Check(!s.AnyVote(), "votes of an epoch that is over are dropped");
  s.Advance();
  s.Advance();
  Check(s.position() == 2 && s.group_index() == 0, "the schedule repeats");
}

// A vote of `position` in epoch 1 carrying `input` (empty: none).
Vote Carrying(int64_t position, bool ready, const std::string& input) {
  Vote v = V(1, position, ready);
  SerializeWithRoom(&v, input.size());
  if (!input.empty()) std::memcpy(&v.wire[v.input_offset], input.data(), input.size());
  return v;
}

void TestVotedInputs() {
  SteadySchedule s(/*rank=*/0, /*size=*/3);
  s.Enter(1, {Group({"a"}), Group({"b"})});
  std::vector<const char*> parts;
  s.OnVote(1, Carrying(0, true, "peer1"));
  s.VoteSelf(Carrying(0, true, "mine0"));
  Check(!s.VotedInputs(&parts), "no inputs before every rank voted");
  s.OnVote(2, Carrying(0, true, "peer2"));
  Check(s.VotedInputs(&parts) && parts.size() == 3 && std::string(parts[0], 5) == "mine0" &&
            std::string(parts[2], 5) == "peer2",
        "every ready vote carried an input: one per rank, in rank order");
  s.Advance();
  s.VoteSelf(Carrying(1, true, "mine0"));
  s.OnVote(1, V(1, 1, true));  // no input: this position runs the collective
  s.OnVote(2, Carrying(1, true, "peer2"));
  Check(s.Decide() == SteadySchedule::Outcome::kRun && !s.VotedInputs(&parts), "one vote without input");
  s.Advance();
  s.OnVote(2, Carrying(2, true, "longer!"));
  s.OnVote(1, Carrying(2, true, "peer1"));
  s.VoteSelf(Carrying(2, true, "mine0"));
  Check(!s.VotedInputs(&parts), "inputs of different lengths are not reduced");
  s.Advance();
  s.OnVote(1, Carrying(3, false, "ignored"));
  Check(s.Decide() == SteadySchedule::Outcome::kExit && !s.VotedInputs(&parts), "an exit vote runs nothing");
  const std::string binary("\0\1binary", 8);
  Vote back;
  Check(Deserialize(Serialize(Carrying(5, true, binary)), &back).ok() && back.input_size == 8 &&
            std::string(back.input(), back.input_size) == binary && back.position == 5 && back.ready,
        "a vote's input round trip");
  std::string cut = Serialize(Carrying(5, true, binary));
  cut.pop_back();
  Check(!Deserialize(cut, &back).ok(), "a vote whose input is cut short is refused");
}

// Ballots are recycled from one position to the next (NodePool): across many
// positions, with a peer's vote for the next position arriving before this
// one ran (two ballots live), each position sees exactly its own votes.
void TestBallotsRecycledAcrossPositions() {
  SteadySchedule s(/*rank=*/0, /*size=*/2);
  s.Enter(1, {Group({"a"}), Group({"b"})});
  std::vector<const char*> parts;
  bool right = true;
  s.OnVote(1, Carrying(0, true, "p0"));
  for (int64_t k = 0; k < 40 && right; ++k) {
    const std::string mine = "m" + std::to_string(k % 10), peer = "p" + std::to_string((k + 1) % 10);
    s.VoteSelf(Carrying(k, true, mine));
    if (k % 4 == 3) {  // the peer's next vote has no input: that position runs the collective
      s.OnVote(1, V(1, k + 1, true));
    } else {
      s.OnVote(1, Carrying(k + 1, true, peer));
    }
    const bool voted = s.VotedInputs(&parts);
    // Position k's peer vote was cast in step k - 1 (position 0's before the loop).
    const bool expect_inputs = k % 4 != 0;
    right = s.Decide() == SteadySchedule::Outcome::kRun && voted == (expect_inputs || k == 0) &&
            (!voted || (parts.size() == 2 && std::string(parts[0], 2) == mine &&
                        std::string(parts[1], 2) == (k == 0 ? "p0" : "p" + std::to_string(k % 10))));
    s.Advance();
  }
  Check(right && s.position() == 40, "recycled ballots: every position sees only its own votes and inputs");
}

Vote Barrier(int64_t position) {
  Vote v = V(1, position, false);
  v.barrier = true;
  return v;
}

void TestBarrierVotes() {
  SteadySchedule s(/*rank=*/0, /*size=*/2);
  s.Enter(1, {Group({"a"}), Group({"b"})});
  s.VoteSelf(Barrier(0));
  Check(s.Decide() == SteadySchedule::Outcome::kWait, "a barrier waits for every rank");
  s.OnVote(1, Barrier(0));
  Check(s.Decide() == SteadySchedule::Outcome::kBarrier, "every rank at the barrier");
  s.Advance();
  Check(s.position() == 1 && s.group_index() == 0, "a barrier keeps the group");
  s.VoteSelf(true);
  s.OnVote(1, V(1, 1, true));
  Check(s.Decide() == SteadySchedule::Outcome::kRun, "then the group runs");
  s.Advance();
  Check(s.group_index() == 1, "and the next group follows");
  s.VoteSelf(true);
  s.OnVote(1, Barrier(2));
  Check(s.Decide() == SteadySchedule::Outcome::kExit, "ready against barrier: the ranks diverged");
  Vote back;
  Check(Deserialize(Serialize(Barrier(3)), &back).ok() && back.barrier && !back.ready && back.position == 3,
        "a barrier vote round trip");
}

void TestMessages() {
  Vote v = V(7, 123456789012, true), back;
  Check(
      Deserialize(Serialize(v), &back).ok() && back.epoch == 7 && back.position == 123456789012 && back.ready,
      "vote round trip");
  Check(PeekControlKind(Serialize(v)) == ControlKind::kVote, "vote kind");
  ResponseList l, lb;
  l.responses.push_back(Group({"r"}));
  l.schedule_epoch = 3;
  l.schedule = {Group({"a", "b"}), Group({"c"})};
  Check(Deserialize(Serialize(l), &lb).ok() && lb.schedule_epoch == 3 && lb.schedule.size() == 2 &&
            lb.schedule[0].names[1] == "b" && lb.responses.size() == 1,
        "schedule round trip");
  std::string cut = Serialize(v);
  cut.pop_back();
  Check(!Deserialize(cut, &back).ok(), "a truncated vote is refused");
}

}  // namespace

int main() {
  TestLearnsAndAnnouncesToEveryRank();
  TestNotAnnouncedWithWorkPending();
  TestOtherResponsesRestartLearning();
  TestSettingOff();
  TestLearnerPeriod();
  TestVotes();
  TestVotedInputs();
  TestBallotsRecycledAcrossPositions();
  TestBarrierVotes();
  TestMessages();
  return Report();
}
