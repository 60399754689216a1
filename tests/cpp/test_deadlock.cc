// Tests of the deadlock detector (csrc/coordinator/deadlock.*) as pure logic,
// and of the coordinator acting on it: blocked ranks' reports go in through
// Add(), error responses come out of Drain(). No sockets, no threads, no wall
// time. Prints "N passed, M failed".
#include <memory>

#include "coord_test_util.h"
#include "coordinator/coordinator.h"
#include "coordinator/deadlock.h"

using namespace hvdlite;
using namespace coordtest;

namespace {

WaitKey Key(const std::string& name, int32_t set = 0) { return WaitKey{set, name}; }

UndecidedTensor Tensor(OpType type, std::vector<int> submitted, std::vector<int> missing) {
  UndecidedTensor t;
  t.type = type;
  t.submitted = std::move(submitted);
  t.missing = std::move(missing);
  return t;
}

void TestCycleOfTwo() {
  std::map<int, RankWaits> waits{{0, {{Key("a")}}}, {1, {{Key("b")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("a"), Tensor(OpType::kAllreduce, {0}, {1})},
                                               {Key("b"), Tensor(OpType::kAllreduce, {1}, {0})}};
  DeadlockReport r;
  Check(FindDeadlock(waits, undecided, &r), "each rank waits for what only it submitted: a deadlock");
  Check(r.ranks == std::vector<int>{0, 1}, "both ranks are deadlocked");
  Check(r.tensors.size() == 2, "both waited tensors are failed");
  Check(Contains(r.message,
                 "deadlock: rank 0 waits in allreduce 'a' (submitted by ranks [0]); rank 1 waits "
                 "in allreduce 'b' (submitted by ranks [1]); no operation can complete"),
        "the message names who waits for what: " + r.message);
  Check(Contains(r.message, "Fix: make every rank submit the same collectives"), "the message names the fix");
}

void TestBarrierAgainstReducescatter() {
  std::map<int, RankWaits> waits{{0, {{Key("barrier.0")}}}, {1, {{Key("x")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("barrier.0"), Tensor(OpType::kBarrier, {0}, {1})},
                                               {Key("x"), Tensor(OpType::kReducescatter, {1}, {0})}};
  DeadlockReport r;
  Check(FindDeadlock(waits, undecided, &r), "barrier against reducescatter is a deadlock");
  Check(Contains(r.message,
                 "rank 0 waits in a barrier (submitted by ranks [0]); rank 1 waits in "
                 "reducescatter 'x' (submitted by ranks [1])"),
        "a barrier is named as such: " + r.message);
}

void TestSlowRankIsNoDeadlock() {
  // Rank 1 has not submitted 'a' and is not blocked: it may still submit it.
  std::map<int, RankWaits> waits{{0, {{Key("a")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("a"), Tensor(OpType::kAllreduce, {0}, {1})}};
  DeadlockReport r;
  Check(!FindDeadlock(waits, undecided, &r), "a rank still computing is not deadlocked");
}

void TestChainEndingInAComputingRank() {
  // 0 waits for 1, 1 waits for 2, 2 computes: 2 may submit 'b', then 1 may submit 'a'.
  std::map<int, RankWaits> waits{{0, {{Key("a")}}}, {1, {{Key("b")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("a"), Tensor(OpType::kAllreduce, {0, 2}, {1})},
                                               {Key("b"), Tensor(OpType::kAllreduce, {1, 0}, {2})}};
  DeadlockReport r;
  Check(!FindDeadlock(waits, undecided, &r), "a chain that ends in a computing rank can complete");
}

void TestDecidedTensorIsNoDeadlock() {
  // Both ranks wait for 'a', already decided (no longer undecided).
  std::map<int, RankWaits> waits{{0, {{Key("a")}}}, {1, {{Key("a")}}}};
  DeadlockReport r;
  Check(!FindDeadlock(waits, {}, &r), "waiting for a decided tensor is no deadlock");
}

void TestThirdRankCannotHelp() {
  // 0 waits for 'a' (missing 1 and 2), 1 waits for 'b' (missing 0 and 2); 2
  // computes, but 'a' needs rank 1 and 'b' rank 0 whatever rank 2 does.
  std::map<int, RankWaits> waits{{0, {{Key("a")}}}, {1, {{Key("b")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("a"), Tensor(OpType::kAllreduce, {0}, {1, 2})},
                                               {Key("b"), Tensor(OpType::kAllgather, {1}, {0, 2})}};
  DeadlockReport r;
  Check(FindDeadlock(waits, undecided, &r) && r.ranks == std::vector<int>{0, 1},
        "two blocked ranks deadlock whatever a third, computing rank does");
}

void TestAnotherCallerCanProceed() {
  // Rank 0 has two blocked callers; one waits for 'c', which rank 2 may still submit.
  std::map<int, RankWaits> waits{{0, {{Key("a")}, {Key("c")}}}, {1, {{Key("b")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("a"), Tensor(OpType::kAllreduce, {0}, {1})},
                                               {Key("b"), Tensor(OpType::kAllreduce, {1}, {0})},
                                               {Key("c"), Tensor(OpType::kAllreduce, {0, 1}, {2})}};
  DeadlockReport r;
  Check(!FindDeadlock(waits, undecided, &r), "a rank with a caller that can proceed is not deadlocked");
}

void TestOneDeadTensorInAGroupSuffices() {
  // A grouped wait ends only when all its tensors complete.
  std::map<int, RankWaits> waits{{0, {{Key("ok"), Key("a")}}}, {1, {{Key("b")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("a"), Tensor(OpType::kAllreduce, {0}, {1})},
                                               {Key("b"), Tensor(OpType::kAllreduce, {1}, {0})}};
  DeadlockReport r;
  Check(FindDeadlock(waits, undecided, &r) && r.tensors.size() == 2,
        "a group with one tensor that cannot complete blocks its caller");
}

void TestStaleReportIsIgnored() {
  // Rank 1 reports waiting for 'a' but has not submitted this 'a' (the
  // report predates another rank's resubmission of the name).
  std::map<int, RankWaits> waits{{0, {{Key("a")}}}, {1, {{Key("a")}}}};
  std::map<WaitKey, UndecidedTensor> undecided{{Key("a"), Tensor(OpType::kAllreduce, {0}, {1})}};
  DeadlockReport r;
  Check(!FindDeadlock(waits, undecided, &r), "a wait for a tensor the rank has not submitted is ignored");
}

// The coordinator: reports arrive with requests; errors go to every member.
struct Harness {
  Config cfg;
  ProcessSetTable sets;
  std::unique_ptr<Coordinator> coord;
  explicit Harness(int world, bool disable = false) {
    cfg.CYCLE_TIME = 0;
    cfg.DEADLOCK_CHECK_DISABLE = disable;
    sets.Reset(world);
    coord.reset(new Coordinator(cfg, &sets, world, nullptr));
  }
  void Send(int rank, std::vector<Request> reqs, RankWaits waits, bool has_waits = true) {
    RequestList list;
    list.requests = std::move(reqs);
    list.has_waits = has_waits;
    list.waits = std::move(waits);
    coord->Add(rank, list);
  }
  std::vector<ResponseList> Drain() {
    std::vector<ResponseList> out;
    if (!coord->Drain(&out)) out.clear();
    return out;
  }
};

void TestCoordinatorFailsEveryRank() {
  Harness h(2);
  h.Send(0, {Allreduce("a", 0)}, {});
  h.Send(1, {Allreduce("b", 1)}, {});
  h.Send(0, {}, {{Key("a")}});
  Check(h.Drain().empty(), "one blocked rank alone is no deadlock");
  h.Send(1, {}, {{Key("b")}});
  auto out = h.Drain();
  Check(out.size() == 2, "the deadlock is reported at once");
  for (int rank = 0; rank < static_cast<int>(out.size()); ++rank) {
    const auto& rs = out[rank].responses;
    Check(rs.size() == 2, "rank " + std::to_string(rank) + " gets both tensors' errors");
    for (const auto& resp : rs) {
      Check(resp.error_code == StatusCode::kMismatch && Contains(resp.error, "deadlock: rank 0 waits in "),
            "a Mismatch error naming the deadlock: " + resp.error);
    }
  }
  h.Send(0, {}, {});
  h.Send(1, {}, {});
  h.Send(0, {Allreduce("a", 0)}, {{Key("a")}});
  h.Send(1, {Allreduce("a", 1)}, {{Key("a")}});
  out = h.Drain();
  Check(out.size() == 2 && out[0].responses.size() == 1 && out[0].responses[0].error_code == StatusCode::kOk,
        "afterwards the same names run normally");
}

void TestCoordinatorWaitsForTheSlowRank() {
  Harness h(2);
  h.Send(0, {Allreduce("a", 0)}, {{Key("a")}});
  Check(h.Drain().empty(), "rank 1 has not reported: nothing is decided");
  h.Send(1, {Allreduce("a", 1)}, {}, /*has_waits=*/false);
  auto out = h.Drain();
  Check(out.size() == 2 && out[1].responses.size() == 1 && out[1].responses[0].error_code == StatusCode::kOk,
        "the slow rank's submission completes the tensor");
}

void TestCoordinatorDisabled() {
  Harness h(2, /*disable=*/true);
  h.Send(0, {Allreduce("a", 0)}, {{Key("a")}});
  h.Send(1, {Allreduce("b", 1)}, {{Key("b")}});
  Check(h.Drain().empty(), "HVDLITE_DEADLOCK_CHECK_DISABLE leaves it to the stall inspector");
}

void TestWaitsSerialize() {
  RequestList list;
  list.requests.push_back(Allreduce("a", 1));
  list.has_waits = true;
  list.waits = {{Key("a"), Key("b", 3)}, {}};
  RequestList got;
  Check(Deserialize(Serialize(list), &got).ok() && got.has_waits && got.waits.size() == 2 &&
            got.waits[0].size() == 2 && got.waits[0][1] == Key("b", 3) && got.waits[1].empty() &&
            got.requests.size() == 1,
        "waits survive serialization");
  RequestList none;
  Check(Deserialize(Serialize(RequestList{}), &none).ok() && !none.has_waits, "no waits: none read back");
}

WaitKey Recv(const std::string& name, int src, int32_t tag) {
  WaitKey k{0, name};
  k.p2p_src = src;
  k.tag = tag;
  return k;
}

// Rank 0 receives from rank 1, which waits in an allreduce only it submitted:
// only rank 0 gets the receive's error (a kRecv response naming the pair);
// both get the allreduce's. A receive whose source is computing is no deadlock.
void TestCoordinatorFailsADeadlockedRecv() {
  Harness h(2);
  h.Send(1, {Allreduce("b", 1)}, {});
  h.Send(0, {}, {{Recv("act", 1, 7)}});
  Check(h.Drain().empty(), "rank 1 is computing: rank 0's recv may still come");
  h.Send(1, {}, {{Key("b")}});
  auto out = h.Drain();
  Check(out.size() == 2, "the deadlock is reported at once");
  const Response* recv = nullptr;
  for (const auto& resp : out[0].responses) recv = resp.type == OpType::kRecv ? &resp : recv;
  Check(recv != nullptr && recv->names == std::vector<std::string>{"act"} &&
            recv->first_dims == std::vector<int64_t>{1, 7} && recv->error_code == StatusCode::kMismatch,
        "rank 0's recv fails, naming source and tag");
  Check(recv && Contains(recv->error, "rank 0 waits in recv of tensor 'act' from rank 1 with tag 7") &&
            Contains(recv->error, "rank 1 waits in allreduce 'b'") &&
            Contains(recv->error, "post every send a peer waits for"),
        "the message names the pair, the peer's wait and the fix: " + (recv ? recv->error : std::string()));
  for (const auto& resp : out[1].responses) Check(resp.type != OpType::kRecv, "rank 1 posted no recv");
}

void TestRecvWaitsSerialize() {
  RequestList list;
  list.has_waits = true;
  list.waits = {{Recv("x", 3, 9)}};
  RequestList got;
  Check(Deserialize(Serialize(list), &got).ok() && got.waits.size() == 1 && got.waits[0].size() == 1 &&
            got.waits[0][0] == Recv("x", 3, 9),
        "a recv's source and tag survive serialization");
}

}  // namespace

int main() {
  TestCoordinatorFailsADeadlockedRecv();
  TestRecvWaitsSerialize();
  TestCycleOfTwo();
  TestBarrierAgainstReducescatter();
  TestSlowRankIsNoDeadlock();
  TestChainEndingInAComputingRank();
  TestDecidedTensorIsNoDeadlock();
  TestThirdRankCannotHelp();
  TestAnotherCallerCanProceed();
  TestOneDeadTensorInAGroupSuffices();
  TestStaleReportIsIgnored();
  TestCoordinatorFailsEveryRank();
  TestCoordinatorWaitsForTheSlowRank();
  TestCoordinatorDisabled();
  TestWaitsSerialize();
  return Report();
}
