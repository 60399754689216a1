// Tests of the coordinator's planning (csrc/coordinator/coordinator.*) as pure
// logic: requests go in through Add(), responses come out of Drain(), and time
// is a fake clock the test moves. No sockets, no threads, no wall time.
// Covers negotiation, mismatches (an error response for every rank), the
// response cache (compact requests, eviction notices), fusion planning, cycle
// holds, stall detection, join and shutdown. Prints "N passed, M failed".
#include <chrono>
#include <memory>

#include "coord_harness.h"
#include "coord_test_util.h"
#include "coordinator/coordinator.h"

using namespace hvdlite;
using namespace coordtest;

namespace {

using Clock = Coordinator::Clock;

void TestNegotiation() {
  Harness h(3);
  h.Submit(Allreduce("w", 0));
  h.Submit(Allreduce("w", 2));
  Check(h.Drain().empty(), "nothing is decided while a member has not submitted");
  h.Submit(Allreduce("w", 1));
  auto out = h.Drain();
  Check(out.size() == 3, "every rank gets a list");
  for (int r = 0; r < static_cast<int>(out.size()); ++r) {
    const auto& rs = out[r].responses;
    Check(rs.size() == 1 && rs[0].names == std::vector<std::string>{"w"} &&
              rs[0].error_code == StatusCode::kOk && rs[0].type == OpType::kAllreduce,
          "rank " + std::to_string(r) + " runs allreduce 'w'");
  }
  Check(h.Drain().empty(), "a response is sent once");
}

// `bad` is submitted by rank 1, `good` by ranks 0 and 2: every rank must get
// the same error response, naming the disagreeing ranks.
void ExpectMismatch(const std::string& what, const Request& good, const Request& bad,
                    const std::string& part) {
  Harness h(3);
  h.Submit(good);
  Request b = bad;
  b.rank = 1;
  h.Submit(b);
  Request g2 = good;
  g2.rank = 2;
  h.Submit(g2);
  auto out = h.Drain();
  Check(out.size() == 3, what + ": every rank gets a list");
  for (int r = 0; r < static_cast<int>(out.size()); ++r) {
    const auto& rs = out[r].responses;
    bool ok = rs.size() == 1 && rs[0].error_code != StatusCode::kOk && Contains(rs[0].error, part) &&
              Contains(rs[0].error, "rank 1");
    Check(ok, what + ": rank " + std::to_string(r) + " gets the error" +
                  (rs.empty() ? std::string() : " (got '" + rs[0].error + "')"));
  }
}

void TestMismatches() {
  Request w = Allreduce("w", 0, 4);
  Request shape = Allreduce("w", 1, 5);
  ExpectMismatch("shape", w, shape, "Mismatched shapes");
  Request dtype = w;
  dtype.dtype = DataType::kFloat64;
  ExpectMismatch("dtype", w, dtype, "Mismatched dtypes");
  Request op = w;
  op.op = ReduceOp::kMax;
  ExpectMismatch("op", w, op, "Mismatched reduce ops");
  Request type = w;
  type.type = OpType::kAllgather;
  ExpectMismatch("collective", w, type, "Mismatched operations");
  Request bcast = w;
  bcast.type = OpType::kBroadcast;
  bcast.root = 0;
  Request root = bcast;
  root.root = 2;
  ExpectMismatch("root", bcast, root, "Mismatched root ranks");
}

// One full round of tensor `name` from every rank; returns rank 0's response.
Response Round(Harness* h, const Request& r, const std::vector<int>& ranks) {
  h->SubmitAll(r, ranks);
  auto out = h->Drain();
  return out.empty() || out[0].responses.empty() ? Response{} : out[0].responses[0];
}

void TestCacheNegotiation() {
  Harness h(2);
  const std::vector<int> ranks = {0, 1};
  Check(Round(&h, Allreduce("w", 0), ranks).cache_ids == std::vector<int32_t>{-1},
        "first sighting: not cached");
  const int32_t id = Round(&h, Allreduce("w", 0), ranks).cache_ids.at(0);
  Check(id >= 0, "second sighting: cached");
  Request compact;  // what a worker sends in steady state: (rank, id) only
  compact.cache_id = id;
  compact.name = "";
  for (int r : ranks) {
    RequestList list;
    list.requests.push_back(compact);
    h.coord->Add(r, list);
  }
  auto out = h.Drain();
  Check(out.size() == 2 && out[1].responses.size() == 1 && out[1].responses[0].names[0] == "w",
        "compact requests are expanded and negotiated");
  RequestList stale;
  stale.requests.push_back(compact);
  stale.requests[0].cache_id = 999;
  h.coord->Add(1, stale);
  Check(h.Drain().empty(), "an unknown cache id is dropped");
}

// Capacity 1: admitting 'y' evicts 'x'; the notice goes to every member, and
// the retired entry is dropped once every member acknowledged it.
void TestEvictionNotices() {
  Harness h(2, /*cache_capacity=*/1);
  const std::vector<int> ranks = {0, 1};
  Round(&h, Allreduce("x", 0), ranks);
  const int32_t x = Round(&h, Allreduce("x", 0), ranks).cache_ids.at(0);
  Round(&h, Allreduce("y", 0), ranks);
  h.SubmitAll(Allreduce("y", 0), ranks);
  auto out = h.Drain();
  for (int r : ranks) {
    Check(out.size() == 2 && out[r].evicted_cache_ids == std::vector<int32_t>{x} && out[r].eviction_seq == 1,
          "rank " + std::to_string(r) + " is told that x's id is evicted");
  }
  Check(h.coord->cache().retired() == 1, "x is retired until acknowledged");
  for (int r : ranks) {
    RequestList ack;
    ack.cache_ack = 1;
    h.coord->Add(r, ack);
  }
  Check(h.coord->cache().retired() == 0, "acknowledged by every member: dropped");
}

void TestFusionPlanning() {
  Harness h(2);
  const std::vector<int> ranks = {0, 1};
  h.coord->SetFusionThreshold(3 * 16);  // three 4-element float32 tensors
  for (int i = 0; i < 5; ++i) h.SubmitAll(Allreduce("t" + std::to_string(i), 0), ranks);
  Request other = Allreduce("f64", 0);
  other.dtype = DataType::kFloat64;
  h.SubmitAll(other, ranks);
  Request gather = Allreduce("g", 0);
  gather.type = OpType::kAllgather;
  h.SubmitAll(gather, ranks);
  auto out = h.Drain();
  Check(out.size() == 2, "fusion: lists for both ranks");
  if (out.size() != 2) return;
  const auto& rs = out[1].responses;
  std::vector<size_t> counts;
  for (const auto& r : rs) counts.push_back(r.names.size());
  Check(counts == std::vector<size_t>({3, 2, 1, 1}),
        "five small allreduces pack 3 + 2 under the threshold; other dtypes and allgathers stay apart");
  Check(rs.size() == 4 && rs[0].names == std::vector<std::string>({"t0", "t1", "t2"}),
        "fused names keep their decided order");

  Harness off(2);
  off.coord->SetFusionThreshold(0);
  for (int i = 0; i < 3; ++i) off.SubmitAll(Allreduce("t" + std::to_string(i), 0), ranks);
  out = off.Drain();
  Check(out.size() == 2 && out[0].responses.size() == 3, "threshold 0: nothing is fused");
}

void TestCycleHold() {
  Harness h(2);
  h.coord->SetCycleTimeMs(10);
  h.SubmitAll(Allreduce("a", 0), {0, 1});
  Check(h.Drain().empty() && h.coord->MsUntilDue() > 0, "held for the cycle time");
  h.Advance(0.005);
  h.SubmitAll(Allreduce("b", 0), {0, 1});
  Check(h.Drain().empty(), "still held after half the cycle");
  h.Advance(0.006);
  auto out = h.Drain();
  Check(out.size() == 2 && out[0].responses.size() == 1 && out[0].responses[0].names.size() == 2,
        "due after the cycle time: both tensors fused in one response");
}

void TestStallDetection() {
  Harness h(3);
  h.Submit(Allreduce("lonely", 0));
  h.Advance(h.cfg.STALL_SHUTDOWN_TIME_SECONDS - 1);
  h.coord->CheckStalls();  // past the warning time: warns only
  Check(h.Drain().empty(), "a stall below the shutdown time only warns");
  h.Advance(2);
  h.coord->CheckStalls();
  auto out = h.Drain();
  Check(out.size() == 3, "stall: every rank gets a list");
  for (int r = 0; r < static_cast<int>(out.size()); ++r) {
    const auto& rs = out[r].responses;
    Check(rs.size() == 1 && rs[0].error_code == StatusCode::kTimeout &&
              Contains(rs[0].error, "ranks 1, 2 never submitted it") && Contains(rs[0].error, "'lonely'"),
          "rank " + std::to_string(r) + " gets the stall error naming the missing ranks");
  }
  // Diverged ranks submit moments apart: both stalled tensors fail in one check
  // (the second is past the warning time).
  Harness d(2);
  d.Submit(Allreduce("first", 0));
  d.Advance(0.5);
  d.Submit(Allreduce("second", 1));
  d.Advance(d.cfg.STALL_SHUTDOWN_TIME_SECONDS - 0.4);
  d.coord->CheckStalls();
  out = d.Drain();
  Check(out.size() == 2 && out[0].responses.size() == 2 && out[1].responses.size() == 2,
        "stalled tensors fail together");
  // The message says what each rank waits in: its oldest undecided submission.
  Check(out.size() == 2 && out[0].responses.size() == 2 &&
            Contains(out[0].responses[0].error,
                     "rank 0 waits in allreduce of 'first', rank 1 in allreduce of "
                     "'second'"),
        "the stall error names what each rank waits in");
}

// join(): a tensor every other member submitted runs once the last one joins, the joined one
// learning its signature from `specs`; when every rank has joined, join returns the last one.
// shutdown: the undecided tensors of its sets fail on every member. A second submission of a
// name in flight (a protocol bug) is dropped and the first kept.
void TestJoinShutdownAndDuplicates() {
  Harness h(3);
  h.SubmitAll(Allreduce("g", 0), {0, 1});
  Request join;
  join.type = OpType::kJoin;
  join.name = "__join__";
  h.SubmitAll(join, {2});
  auto out = h.Drain();
  Check(out.size() == 3 && out[2].responses.size() == 1 && out[2].responses[0].names[0] == "g" &&
            out[2].responses[0].error_code == StatusCode::kOk && out[2].responses[0].specs.size() == 1,
        "a tensor waiting only for a joined rank runs, its signature in specs");
  h.SubmitAll(join, {1, 0});
  out = h.Drain();
  Check(out.size() == 3 && out[1].responses.size() == 1 && out[1].responses[0].type == OpType::kJoin &&
            out[1].responses[0].last_joined_rank == 0,
        "once every rank joined, join returns the last one");

  Harness s(3);
  s.Submit(Allreduce("x", 0));
  Request down;
  down.type = OpType::kShutdown;
  down.name = "__shutdown__";
  s.SubmitAll(down, {2});
  out = s.Drain();
  Check(out.size() == 3 && out[1].responses.size() == 1 &&
            out[1].responses[0].error_code == StatusCode::kAborted &&
            Contains(out[1].responses[0].error, "rank 2 has shut down before submitting it"),
        "a rank's shutdown fails the undecided tensors of its sets on every member");

  Harness d(2);
  d.Submit(Allreduce("d", 0, 4));
  d.Submit(Allreduce("d", 0, 8));
  d.Submit(Allreduce("d", 1, 4));
  out = d.Drain();
  Check(out.size() == 2 && out[0].responses.size() == 1 && out[0].responses[0].error_code == StatusCode::kOk,
        "a second submission of a name in flight is dropped, the first kept");
}

// Each message field means one thing: process set ops carry their own fields,
// and they survive the wire.
void TestProcessSetFieldsAndWire() {
  Harness h(2);
  Request add;
  add.type = OpType::kAddProcessSet;
  add.name = "__add_process_set__";
  add.set_members = {0, 1};
  h.SubmitAll(add, {0, 1});
  auto out = h.Drain();
  Check(out.size() == 2 && out[1].responses.size() == 1 && out[1].responses[0].new_set_id == 1 &&
            h.sets.Ranks(1) == std::vector<int>({0, 1}),
        "add_process_set: the new id travels in new_set_id");
  ResponseList back;
  Check(out.size() == 2 && Deserialize(Serialize(out[1]), &back).ok() && back.responses.size() == 1 &&
            back.responses[0].new_set_id == 1 && back.eviction_seq == out[1].eviction_seq,
        "a response list survives the wire");
  Request rm;
  rm.type = OpType::kRemoveProcessSet;
  rm.name = "__remove_process_set__";
  rm.target_set = 1;
  RequestList list;
  list.requests = {add, rm};
  list.cache_ack = 5;
  RequestList got;
  Check(Deserialize(Serialize(list), &got).ok() && got.cache_ack == 5 && got.requests.size() == 2 &&
            got.requests[0].set_members == add.set_members && got.requests[1].target_set == 1,
        "a request list survives the wire");
  h.SubmitAll(rm, {0, 1});
  h.Drain();
  Check(h.sets.Ranks(1).empty(), "remove_process_set removes target_set");
  add.set_members = {1};
  h.SubmitAll(add, {0, 1});
  out = h.Drain();
  Check(out.size() == 2 && out[1].responses.size() == 1 && out[1].responses[0].new_set_id == 1 &&
            h.sets.Ranks(1) == std::vector<int>({1}),
        "a removed set's id is reused (Horovod's rule: freed ids first, oldest first)");
  add.set_members = {0};
  h.SubmitAll(add, {0, 1});
  out = h.Drain();
  Check(out.size() == 2 && out[1].responses.size() == 1 && out[1].responses[0].new_set_id == 2,
        "with no freed id, the next unused one");
}

// A set registered among its members only (a torch subgroup): two such registrations at once,
// by disjoint groups that leave out rank 0, each complete when their own members submitted, get
// ids of their own, and reach only their members, under the kAmongMembers marker they were
// queued with.
void TestAddAmongMembers() {
  Harness h(4);
  Request a;
  a.type = OpType::kAddProcessSet;
  a.process_set = kAmongMembers;
  a.name = "__add_process_set__.1,2";
  a.set_members = {1, 2};
  Request b = a;
  b.name = "__add_process_set__.0,3";
  b.set_members = {0, 3};
  h.SubmitAll(a, {1});
  h.SubmitAll(b, {3});
  Check(h.Drain().empty(), "a registration among members waits for its members only");
  h.SubmitAll(a, {2});
  h.SubmitAll(b, {0});
  auto out = h.Drain();
  auto only = [&](int rank) { return out.size() == 4 ? out[rank].responses : std::vector<Response>{}; };
  Check(only(1).size() == 1 && only(2).size() == 1 && only(0).size() == 1 && only(3).size() == 1,
        "each member learns its own set, and only its own");
  const int32_t id_a = only(1).empty() ? -1 : only(1)[0].new_set_id;
  const int32_t id_b = only(0).empty() ? -1 : only(0)[0].new_set_id;
  Check(
      id_a > 0 && id_b > 0 && id_a != id_b && only(2)[0].new_set_id == id_a && only(3)[0].new_set_id == id_b,
      "the two sets get distinct ids");
  Check(
      !only(1).empty() && only(1)[0].process_set == kAmongMembers && only(1)[0].error_code == StatusCode::kOk,
      "the response travels under the marker the members queued it with");
  Check(h.sets.Ranks(id_a) == std::vector<int>({1, 2}) && h.sets.Ranks(id_b) == std::vector<int>({0, 3}),
        "the coordinator's table holds both sets");
}

// The removal of such a set, negotiated on the set itself (process_set == target_set): it waits
// for the set's members only, reaches only them, frees the id for the next registration, and a
// non-member's submission is refused naming the members.
void TestRemoveAmongMembers() {
  Harness h(3);
  Request a;
  a.type = OpType::kAddProcessSet;
  a.process_set = kAmongMembers;
  a.name = "__add_process_set__.1,2";
  a.set_members = {1, 2};
  h.SubmitAll(a, {1, 2});
  h.Drain();
  const int32_t id = 1;
  Check(h.sets.Ranks(id) == std::vector<int>({1, 2}), "registered among members");
  Request rm;
  rm.type = OpType::kRemoveProcessSet;
  rm.process_set = id;
  rm.target_set = id;
  rm.name = "__remove_process_set__.1[1,2]";
  h.Submit(Allreduce("stray", 1, 4, id));  // rank 2 never submits it
  h.SubmitAll(rm, {1});
  Check(h.Drain().empty() && h.sets.Exists(id), "a removal among members waits for every member");
  h.SubmitAll(rm, {2});
  auto out = h.Drain();
  Check(out.size() == 3 && out[0].responses.empty() && out[1].responses.size() == 2 &&
            out[2].responses.size() == 1 && out[2].responses[0].error_code == StatusCode::kOk,
        "the removal reaches its members only");
  Check(out.size() == 3 && out[1].responses.size() == 2 && out[1].responses[0].names[0] == "stray" &&
            out[1].responses[0].error_code == StatusCode::kAborted &&
            out[1].responses[0].error.find("was removed") != std::string::npos &&
            out[1].responses[1].error_code == StatusCode::kOk,
        "a tensor of the set not every member submitted fails on its submitters, before the removal");
  Check(!h.sets.Exists(id), "the coordinator's table no longer holds the set");
  Request b = a;
  b.name = "__add_process_set__.0,1";
  b.set_members = {0, 1};
  h.SubmitAll(b, {0, 1});
  out = h.Drain();
  Check(out.size() == 3 && out[0].responses.size() == 1 && out[0].responses[0].new_set_id == id,
        "the freed id goes to the next registration");
  rm.name = "__remove_process_set__.1[0,1]";
  h.SubmitAll(rm, {2});
  out = h.Drain();
  Check(out.size() == 3 && out[2].responses.size() == 1 &&
            out[2].responses[0].error_code == StatusCode::kInvalidArgument &&
            out[2].responses[0].error.find("not a member") != std::string::npos && h.sets.Exists(id),
        "a non-member's removal is refused and the set stays");
}

}  // namespace

int main() {
  TestNegotiation();
  TestMismatches();
  TestCacheNegotiation();
  TestEvictionNotices();
  TestFusionPlanning();
  TestCycleHold();
  TestStallDetection();
  TestJoinShutdownAndDuplicates();
  TestProcessSetFieldsAndWire();
  TestAddAmongMembers();
  TestRemoveAmongMembers();
  return Report();
}
