// Tests of the steady state's logic (csrc/coordinator/steady_state.*) as pure
// logic: the coordinator learning a schedule from the responses it decides
// (requests in through Add(), the announcement out of Drain()), the ranks'
// votes on the binomial vote tree (ranks joined by an in-process network),
// and the messages that carry both. No sockets, no threads,
// no wall time. Prints "N passed, M failed".
#include <algorithm>
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

Vote V(bool ready, const std::string& input = "") {
  Vote v;
  v.ready = ready;
  SerializeWithRoom(&v, input.size());
  if (!input.empty()) std::memcpy(&v.wire[v.input_offset], input.data(), input.size());
  return v;
}

Vote Barrier() {
  Vote v;
  v.barrier = true;
  return v;
}

// `n` ranks' SteadySchedules joined by a lossless in-order network: Deliver()
// moves every outbox's messages to their peers until none is left, and counts them.
struct Net {
  std::vector<SteadySchedule> ranks;
  int64_t messages = 0;
  std::vector<int> departed;
  explicit Net(int n, int64_t epoch = 1, std::vector<Response> groups = {Group({"a"}), Group({"b", "c"})}) {
    for (int r = 0; r < n; ++r) {
      ranks.emplace_back(r, n);
      ranks.back().Enter(epoch, groups);
    }
  }
  void Deliver() {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < static_cast<int>(ranks.size()); ++r) {
        std::vector<SteadySchedule::Outgoing> out;
        ranks[r].TakeOutgoing(&out);
        for (auto& o : out) {
          ++messages;
          moved = true;
          VoteMessage m;
          Check(Deserialize(o.bytes(), &m).ok(), "a vote message parses");
          ranks[o.peer].OnMessage(r, m, o.bytes());
        }
      }
    }
  }
  bool All(SteadySchedule::Outcome want) const {
    for (const auto& s : ranks) {
      if (s.Decide() != want) return false;
    }
    return true;
  }
  void AdvanceAll() {
    for (auto& s : ranks) s.Advance();
  }
};

void TestVoteTree() {
  Check(VoteTree::Children(0, 6) == std::vector<int>({1, 2, 4}) &&
            VoteTree::Children(4, 6) == std::vector<int>({5}) &&
            VoteTree::Children(2, 6) == std::vector<int>({3}) && VoteTree::Children(5, 6).empty(),
        "binomial tree children");
  Check(VoteTree::Parent(6) == 4 && VoteTree::Parent(5) == 4 && VoteTree::Parent(4) == 0 &&
            VoteTree::SubtreeEnd(4, 6) == 6 && VoteTree::SubtreeEnd(0, 6) == 6 &&
            VoteTree::SubtreeEnd(2, 6) == 4,
        "binomial tree parents and subtrees");
  const int n = 16384;
  bool ok = true;
  size_t most = 0;
  std::vector<int> covered(n, 0);
  for (int r = 0; r < n; ++r) {
    const auto kids = VoteTree::Children(r, n);
    most = std::max(most, kids.size());
    for (int c : kids) ok &= VoteTree::Parent(c) == r && ++covered[c] == 1;
  }
  for (int r = 1; r < n; ++r) ok &= covered[r] == 1;
  Check(ok && most == 14, "16384 ranks: every rank but 0 has one parent; at most log2(n) children");
}

void TestVotes() {
  Net net(5);
  int32_t id = -1;
  size_t group = 9;
  Check(net.ranks[1].Find("c", &id, &group) && id == 1 && group == 1, "find c in group 1");
  Check(!net.ranks[1].Find("zz", &id, &group), "unknown name");
  for (int r = 4; r >= 1; --r) net.ranks[r].VoteSelf(true);
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kWait), "no decision before rank 0 voted");
  Check(net.ranks[0].Aware() && net.ranks[4].Aware() && net.ranks[3].Aware(), "voters are aware");
  net.ranks[0].VoteSelf(true);
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kRun), "unanimous ready runs, on every rank");
  Check(net.messages == 2 * (5 - 1), "one report up and one decision down per rank: 2(n-1) messages");
  net.AdvanceAll();
  Check(net.ranks[3].group_index() == 1 && !net.ranks[3].VotedSelf(), "position 1");
  net.messages = 0;
  net.ranks[3].VoteSelf(false);  // exit before anyone else voted
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kExit),
        "one exit: every rank leaves, without waiting for the others");
  Check(net.messages == 2 + 4, "the exit goes straight up (3 -> 2 -> 0) and the decision down");
  net.ranks[1].VoteSelf(true);  // after the decision: changes nothing
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kExit), "a late vote changes nothing");
}

void TestEpochs() {
  SteadySchedule s(/*rank=*/0, /*size=*/2);
  VoteMessage m;
  m.type = VoteMessage::Type::kReport;
  m.epoch = 1;
  m.outcome = VoteMessage::kReady;
  s.OnMessage(1, m, Serialize(m));  // before this rank entered epoch 1: kept
  s.Enter(1, {Group({"a"})});
  s.VoteSelf(true);
  Check(s.Decide() == SteadySchedule::Outcome::kRun, "a report of an epoch not entered yet is kept for it");
  s.Advance();
  s.Leave();
  m.position = 1;
  s.OnMessage(1, m, Serialize(m));  // an epoch that is over
  s.Enter(2, {Group({"a"})});
  Check(!s.Aware(), "messages of an epoch that is over are dropped");
  s.Advance();
  s.Advance();
  Check(s.position() == 2 && s.group_index() == 0, "the schedule repeats");
}

void TestVotedInputs() {
  Net net(3);
  std::vector<const char*> parts;
  net.ranks[1].VoteSelf(V(true, "peer1"));
  net.ranks[0].VoteSelf(V(true, "mine0"));
  net.Deliver();
  Check(!net.ranks[0].VotedInputs(&parts), "no inputs before every rank voted");
  net.ranks[2].VoteSelf(V(true, "peer2"));
  net.Deliver();
  bool all = true;
  for (auto& s : net.ranks) {
    all &= s.VotedInputs(&parts) && parts.size() == 3 && std::string(parts[0], 5) == "mine0" &&
           std::string(parts[1], 5) == "peer1" && std::string(parts[2], 5) == "peer2";
  }
  Check(all, "every rank holds every input, in rank order");
  net.AdvanceAll();
  net.ranks[0].VoteSelf(V(true, "mine0"));
  net.ranks[1].VoteSelf(V(true));  // no input: this position runs the collective
  net.ranks[2].VoteSelf(V(true, "peer2"));
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kRun) && !net.ranks[2].VotedInputs(&parts),
        "one vote without input");
  net.AdvanceAll();
  net.ranks[0].VoteSelf(V(true, "mine0"));
  net.ranks[1].VoteSelf(V(true, "peer1"));
  net.ranks[2].VoteSelf(V(true, "longer!"));
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kRun) && !net.ranks[0].VotedInputs(&parts),
        "inputs of different lengths are not reduced");
  net.AdvanceAll();
  net.ranks[0].VoteSelf(V(true, "mine0"));
  net.ranks[1].VoteSelf(V(false, "ignored"));
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kExit) && !net.ranks[0].VotedInputs(&parts),
        "an exit vote runs nothing");
}

// Ballots are recycled from one position to the next (NodePool): across many
// positions, with a child's report for the next position arriving before its
// parent ran this one (two ballots live), each position sees only its own votes.
void TestBallotsRecycledAcrossPositions() {
  Net net(2, 1, {Group({"a"}), Group({"b"})});
  std::vector<const char*> parts;
  bool right = true;
  for (int64_t k = 0; k < 40 && right; ++k) {
    const std::string mine = "m" + std::to_string(k % 10), peer = "p" + std::to_string(k % 10);
    net.ranks[1].VoteSelf(k % 4 == 3 ? V(true) : V(true, peer));
    net.ranks[0].VoteSelf(V(true, mine));
    net.Deliver();
    net.ranks[1].Advance();
    if (k + 1 < 40) {  // rank 1 votes for the next position before rank 0 ran this one
      net.ranks[1].VoteSelf(k % 4 == 2 ? V(true) : V(true, "p" + std::to_string((k + 1) % 10)));
      net.Deliver();
    }
    const bool voted = net.ranks[0].VotedInputs(&parts);
    right = net.ranks[0].Decide() == SteadySchedule::Outcome::kRun && voted == (k % 4 != 3) &&
            (!voted || (std::string(parts[0], 2) == mine && std::string(parts[1], 2) == peer));
    net.ranks[0].Advance();
    if (k + 1 < 40) {
      net.ranks[0].VoteSelf(V(true, "m" + std::to_string((k + 1) % 10)));
      net.Deliver();
      net.ranks[1].Advance();
      net.ranks[0].Advance();
      ++k;
    }
  }
  Check(right && net.ranks[0].position() == 40 && net.ranks[1].position() == 40,
        "recycled ballots: every position sees only its own votes and inputs");
}

void TestBarrierVotes() {
  Net net(2, 1, {Group({"a"}), Group({"b"})});
  net.ranks[0].VoteSelf(Barrier());
  net.Deliver();
  Check(net.ranks[0].Decide() == SteadySchedule::Outcome::kWait, "a barrier waits for every rank");
  net.ranks[1].VoteSelf(Barrier());
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kBarrier), "every rank at the barrier");
  net.AdvanceAll();
  Check(net.ranks[1].position() == 1 && net.ranks[1].group_index() == 0, "a barrier keeps the group");
  net.ranks[0].VoteSelf(true);
  net.ranks[1].VoteSelf(true);
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kRun), "then the group runs");
  net.AdvanceAll();
  Check(net.ranks[0].group_index() == 1, "and the next group follows");
  net.ranks[0].VoteSelf(true);
  net.ranks[1].VoteSelf(Barrier());
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kExit), "ready against barrier: the ranks diverged");
}

// Ranks 5, 6 and 7 do not vote: 4 (the parent of 5 and 6) stalls, which wakes
// them (6 passes the wake to 7) and tells rank 0 who is missing; an idle rank
// would then vote exit; a hung one stays missing and is named.
void TestStallWakesIdleRanksAndNamesMissing() {
  Net net(8);
  for (int r : {0, 1, 2, 3, 4}) net.ranks[r].VoteSelf(true);
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kWait) && !net.ranks[5].Aware() && !net.ranks[7].Aware(),
        "idle ranks know nothing yet, and nothing is decided");
  Check(net.ranks[0].Missing() == std::vector<int>({4, 5, 6, 7}),
        "rank 0 only knows rank 4's subtree is missing");
  const int64_t before = net.messages;
  net.ranks[4].Stall();
  net.ranks[4].Stall();  // once per position
  net.Deliver();
  Check(net.ranks[5].Aware() && net.ranks[6].Aware() && net.ranks[7].Aware() &&
            net.ranks[0].Missing() == std::vector<int>({5, 6, 7}),
        "the stall wakes the idle ranks and names them at rank 0");
  Check(net.messages - before == 4, "a stall costs a notice up and a wake per silent rank");
  net.ranks[5].VoteSelf(true);
  net.ranks[7].VoteSelf(true);
  net.Deliver();
  Check(net.ranks[0].Missing() == std::vector<int>({6, 7}), "later votes update the notice (7's waits at 6)");
  net.ranks[6].Stall();  // 6's own stall delay
  net.Deliver();
  Check(net.ranks[0].Missing() == std::vector<int>({6}), "6's own notice names only 6");
  net.ranks[0].Fail("ranks 6 sent no steady-state vote");
  net.Deliver();
  Check(net.All(SteadySchedule::Outcome::kFail) &&
            net.ranks[7].failure() == "ranks 6 sent no steady-state vote",
        "rank 0 gives up: every rank fails with its message");
}

void TestDepartedPeers() {
  Net net(4);
  net.ranks[0].VoteSelf(true);
  net.ranks[1].VoteSelf(true);
  net.ranks[0].PeerDeparted(2);  // rank 2 (and with it rank 3's report) is gone
  net.Deliver();
  Check(net.ranks[0].Decide() == SteadySchedule::Outcome::kExit &&
            net.ranks[1].Decide() == SteadySchedule::Outcome::kExit,
        "a departed child counts as exit");
  Net lone(4);
  lone.ranks[3].VoteSelf(true);
  lone.ranks[3].PeerDeparted(2);
  Check(lone.ranks[3].Decide() == SteadySchedule::Outcome::kExit, "a departed parent: this subtree leaves");
}

void TestMessages() {
  VoteMessage m, back;
  m.type = VoteMessage::Type::kDecision;
  m.epoch = 7;
  m.position = 123456789012;
  m.outcome = VoteMessage::kReady;
  m.input_size = 4;
  m.payload = std::string("\0\1\2\3abcd", 8);
  Check(Deserialize(Serialize(m), &back).ok() && back.type == m.type && back.epoch == 7 &&
            back.position == 123456789012 && back.outcome == VoteMessage::kReady && back.input_size == 4 &&
            std::string(back.payload_data(), back.payload_size()) == m.payload,
        "vote message round trip (the moved wire kept whole)");
  const std::string wire = Serialize(m);
  Check(Deserialize(wire, &back).ok() && back.payload_offset == 0 && back.payload == m.payload,
        "vote message round trip (payload copied out)");
  Vote own;
  own.epoch = 7;
  own.position = 9;
  own.ready = true;
  SerializeWithRoom(&own, 4);
  std::memcpy(&own.wire[own.input_offset], "wxyz", 4);
  Check(Deserialize(std::string(own.wire), &back).ok() && back.type == VoteMessage::Type::kReport &&
            back.epoch == 7 && back.position == 9 && back.outcome == VoteMessage::kReady &&
            back.input_size == 4 && std::string(back.payload_data(), back.payload_size()) == "wxyz",
        "a packed vote is a report as it is");
  Check(PeekControlKind(Serialize(m)) == ControlKind::kVote, "vote kind");
  ResponseList l, lb;
  l.responses.push_back(Group({"r"}));
  l.schedule_epoch = 3;
  l.schedule = {Group({"a", "b"}), Group({"c"})};
  Check(Deserialize(Serialize(l), &lb).ok() && lb.schedule_epoch == 3 && lb.schedule.size() == 2 &&
            lb.schedule[0].names[1] == "b" && lb.responses.size() == 1,
        "schedule round trip");
  std::string cut = Serialize(m);
  cut.pop_back();
  Check(!Deserialize(cut, &back).ok(), "a vote message whose inputs are cut short is refused");
  Check(!Deserialize(cut.substr(0, 10), &back).ok(), "a truncated header is refused");
}

}  // namespace

int main() {
  TestLearnsAndAnnouncesToEveryRank();
  TestNotAnnouncedWithWorkPending();
  TestOtherResponsesRestartLearning();
  TestSettingOff();
  TestLearnerPeriod();
  TestVoteTree();
  TestVotes();
  TestEpochs();
  TestVotedInputs();
  TestBallotsRecycledAcrossPositions();
  TestBarrierVotes();
  TestStallWakesIdleRanksAndNamesMissing();
  TestDepartedPeers();
  TestMessages();
  return Report();
}
