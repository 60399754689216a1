// ScaleSim: the control plane of an N-rank job in one process, as pure logic
// (issue 29 part 5). Every simulated rank has what a real rank has on its
// control plane: a LocalRequestCache and a SteadySchedule; rank 0 also has the
// Coordinator (with its ResponseCache, schedule learner and deadlock
// detector) on a fake clock. Messages are the real serialized bytes, moved
// between the ranks by an in-order queue; no sockets, no threads, no sleeps.
//
// What it measures per step: each rank's CPU time (thread CPU clock around
// that rank's own work: building, parsing and handling its messages, the
// coordinator's work for rank 0) and the control messages each rank sends and
// receives. tests/cpp/test_scale_sim.cc checks it at small N;
// benchmarks/scale_simulation.cc runs it at up to 16,384 ranks.
// Threading: single-threaded.
#pragma once
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/relay.h"
#include "coordinator/response_cache.h"
#include "coordinator/steady_state.h"

namespace scalesim {

using namespace hvdlite;

// CPU seconds this thread has used.
inline double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// What one step cost.
struct StepCost {
  std::vector<double> cpu;        // per rank: CPU seconds
  std::vector<int64_t> sent;      // per rank: control messages sent
  std::vector<int64_t> received;  // per rank: control messages received
  int64_t bytes = 0;              // control bytes moved in all
  int positions = 0;              // steady state: schedule positions run
  double Rank0Cpu() const { return cpu[0]; }
  double MeanCpu() const {
    double s = 0;
    for (double c : cpu) s += c;
    return s / static_cast<double>(cpu.size());
  }
  double MessagesPerRank() const {  // sent + received, averaged over ranks
    int64_t s = 0;
    for (size_t r = 0; r < sent.size(); ++r) s += sent[r] + received[r];
    return static_cast<double>(s) / static_cast<double>(sent.size());
  }
  int64_t MaxMessages() const {
    int64_t m = 0;
    for (size_t r = 0; r < sent.size(); ++r) m = std::max(m, sent[r] + received[r]);
    return m;
  }
};

class ScaleSim {
 public:
  using Clock = Coordinator::Clock;
  // `model`: one step's tensors (their requests, as rank 0 would submit them).
  ScaleSim(int n, std::vector<Request> model, const Config& cfg = Config())
      : n_(n), model_(std::move(model)), cfg_(cfg), caches_(n), inbox_(n) {
    sets_.Reset(n);
    for (size_t i = 0; i < model_.size(); ++i) index_[model_[i].name] = i;
    coordinator_.reset(new Coordinator(cfg_, &sets_, n, nullptr, [this] { return now_; }));
    for (int r = 0; r < n; ++r) {
      schedules_.emplace_back(r, n);
      relays_.emplace_back(r, n);
    }
  }
  int size() const { return n_; }
  bool scheduled() const { return schedules_[0].active(); }
  const std::vector<std::string>& errors() const { return errors_; }

  // One negotiated step: every rank sends its requests for the whole model
  // (cached ones compact) and, when `blocked` is set, the report of a caller
  // blocked on all of them, up the relay tree (NegotiationRelay) to rank 0,
  // whose coordinator decides; each rank's responses come back down the tree,
  // and the rank takes them in (cache ids, a schedule).
  // `skip_last`: rank n-1 submits "extra" instead of the model's last tensor
  // (the deadlock detector must fail both).
  // Ranks act from n-1 down to 0 going up (a parent after its children, which
  // have higher ranks), and from 0 up going down: so each forwards its whole
  // subtree in one message each way (the runtime forwards whatever arrived
  // in a turn: the same or a few more messages, depending on timing).
  StepCost NegotiationStep(bool blocked = false, bool skip_last = false) {
    StepCost cost = NewCost();
    for (int r = n_ - 1; r >= 0; --r) {
      const double t0 = ThreadCpuSeconds();
      std::vector<NegotiationRelay::Delivery> mine;
      relays_[r].Up(r, Serialize(OwnRequests(r, blocked, skip_last)), &mine);
      for (auto& m : TakeInbox(&cost, r)) Check(relays_[r].OnMessage(m.first, m.second, &mine));
      for (auto& d : mine) {  // rank 0: every rank's list
        RequestList list;
        Check(Deserialize(d.payload, &list));
        coordinator_->Add(d.rank, d.hi, list);
      }
      SendRelayed(&cost, r);
      cost.cpu[r] += ThreadCpuSeconds() - t0;
    }
    // Rank 0 drains once the cycle time has passed, and sends the responses down.
    const double t0 = ThreadCpuSeconds();
    now_ += std::chrono::seconds(1);
    std::vector<ListRun> runs;
    if (coordinator_->DrainRuns(&runs)) {  // as Runtime::Coordinate: each distinct list serialized once
      std::vector<NegotiationRelay::Delivery> mine;
      for (const auto& run : runs) {
        if (run.hi > 1) relays_[0].Down(std::max(run.lo, 1), run.hi, Serialize(run.list), &mine);
      }
      TakeResponses(0, runs.front().list);
      SendRelayed(&cost, 0);
    }
    cost.cpu[0] += ThreadCpuSeconds() - t0;
    for (int r = 1; r < n_; ++r) {
      const double t1 = ThreadCpuSeconds();
      std::vector<NegotiationRelay::Delivery> mine;
      for (auto& m : TakeInbox(&cost, r)) Check(relays_[r].OnMessage(m.first, m.second, &mine));
      for (auto& d : mine) {
        ResponseList list;
        Check(Deserialize(d.payload, &list));
        TakeResponses(r, list);
      }
      SendRelayed(&cost, r);
      cost.cpu[r] += ThreadCpuSeconds() - t1;
    }
    return cost;
  }

  // One step in schedule mode: at each position, every rank votes ready (in
  // rank order, n-1 first), the vote tree's messages are delivered until
  // none is left, and every rank must have decided kRun.
  StepCost SteadyStep() {
    StepCost cost = NewCost();
    const size_t groups = schedule_groups_;
    for (size_t g = 0; g < groups; ++g) {
      for (int r = n_ - 1; r >= 0; --r) {
        const double t0 = ThreadCpuSeconds();
        Vote v;
        v.ready = true;
        schedules_[r].VoteSelf(std::move(v));
        SendOutbox(&cost, r);
        cost.cpu[r] += ThreadCpuSeconds() - t0;
      }
      DeliverVotes(&cost);
      for (int r = 0; r < n_; ++r) {
        const double t0 = ThreadCpuSeconds();
        if (schedules_[r].Decide() != SteadySchedule::Outcome::kRun) {
          errors_.push_back("rank " + std::to_string(r) + " did not decide to run position " +
                            std::to_string(schedules_[r].position()));
        }
        schedules_[r].Advance();
        cost.cpu[r] += ThreadCpuSeconds() - t0;
      }
      ++cost.positions;
    }
    return cost;
  }

 private:
  using Message = std::pair<int, std::string>;  // (from, wire)

  void SendRelayed(StepCost* cost, int rank) {
    relays_[rank].TakeOutgoing(&relay_out_);
    for (auto& o : relay_out_) Send(cost, rank, o.peer, std::move(o.wire));
    relay_out_.clear();
  }
  // Rank r's RequestList for one step of the model (see NegotiationStep).
  RequestList OwnRequests(int r, bool blocked, bool skip_last) {
    RequestList list;
    for (size_t i = 0; i < model_.size(); ++i) {
      Request q = model_[i];
      if (skip_last && r == n_ - 1 && i + 1 == model_.size()) q.name = "extra";
      q.rank = r;
      caches_[r].Compact(&q);
      list.requests.push_back(std::move(q));
    }
    list.cache_ack = caches_[r].acked();
    if (blocked) {
      list.has_waits = true;
      list.waits.emplace_back();
      for (const Request& q : model_) list.waits.back().push_back(WaitKey{0, q.name});
      if (skip_last && r == n_ - 1) list.waits.back().back().name = "extra";
    }
    return list;
  }
  StepCost NewCost() const {
    StepCost c;
    c.cpu.assign(n_, 0.0);
    c.sent.assign(n_, 0);
    c.received.assign(n_, 0);
    return c;
  }
  void Check(const Status& st) {
    if (!st.ok()) errors_.push_back(st.message());
  }
  // A message from rank 0 to itself (its own requests and responses) is a
  // call, not a message: the runtime hands them over directly; not counted.
  void Send(StepCost* cost, int from, int to, std::string wire) {
    if (from != to) {
      ++cost->sent[from];
      ++cost->received[to];
      cost->bytes += static_cast<int64_t>(wire.size());
    }
    if (inbox_.size() < static_cast<size_t>(n_)) inbox_.resize(n_);
    inbox_[to].emplace_back(from, std::move(wire));
  }
  std::deque<Message> TakeInbox(StepCost*, int rank) {
    if (inbox_.size() < static_cast<size_t>(n_)) inbox_.resize(n_);
    std::deque<Message> out;
    out.swap(inbox_[rank]);
    return out;
  }
  void SendOutbox(StepCost* cost, int rank) {
    schedules_[rank].TakeOutgoing(&outgoing_);
    for (auto& o : outgoing_) Send(cost, rank, o.peer, o.shared != nullptr ? *o.shared : std::move(o.wire));
    outgoing_.clear();
  }
  // Delivers vote-tree messages until none is left; each rank's handling is its own CPU.
  void DeliverVotes(StepCost* cost) {
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < n_; ++r) {
        if (inbox_[r].empty()) continue;
        moved = true;
        const double t0 = ThreadCpuSeconds();
        for (auto& m : TakeInbox(cost, r)) {
          VoteMessage vm;
          Check(Deserialize(m.second, &vm));
          schedules_[r].OnMessage(m.first, vm, m.second);
        }
        SendOutbox(cost, r);
        cost->cpu[r] += ThreadCpuSeconds() - t0;
      }
    }
  }
  // A rank takes in its responses as the executor would: the cache ids its
  // requests now have, the evictions, errors, and an announced schedule.
  void TakeResponses(int r, ResponseList& list) {
    for (const Response& resp : list.responses) {
      if (resp.error_code != StatusCode::kOk) {
        if (r == 0) {
          for (const std::string& name : resp.names) errors_.push_back(name + ": " + resp.error);
        }
        for (size_t i = 0; i < resp.names.size(); ++i) caches_[r].Remember(Named(resp.names[i], r), -1);
        continue;
      }
      for (size_t i = 0; i < resp.names.size(); ++i)
        caches_[r].Remember(Named(resp.names[i], r), resp.cache_ids[i]);
    }
    caches_[r].QueueEvictions(list.evicted_cache_ids, list.eviction_seq);
    caches_[r].ApplyEvictions();
    if (!list.schedule.empty()) {
      schedule_groups_ = list.schedule.size();
      schedules_[r].Enter(list.schedule_epoch, std::move(list.schedule));
    }
  }
  // The request rank r submitted under `name` (the model's, or "extra").
  Request Named(const std::string& name, int r) const {
    auto it = index_.find(name);
    Request out = it != index_.end() ? model_[it->second] : model_.back();
    out.name = name;
    out.rank = r;
    return out;
  }

  int n_;
  std::vector<Request> model_;
  std::unordered_map<std::string, size_t> index_;  // model_ by name
  Config cfg_;
  ProcessSetTable sets_;
  Clock::time_point now_{};
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<LocalRequestCache> caches_;
  std::vector<SteadySchedule> schedules_;
  std::vector<NegotiationRelay> relays_;
  std::vector<NegotiationRelay::Outgoing> relay_out_;
  std::vector<std::deque<Message>> inbox_;
  std::vector<SteadySchedule::Outgoing> outgoing_;
  size_t schedule_groups_ = 0;
  std::vector<std::string> errors_;
};

}  // namespace scalesim
