// SteadyStateDriver: one rank's side of the steady state (the protocol:
// coordinator/steady_state.h). In schedule mode it holds this rank's
// submissions instead of sending them to the coordinator, casts this rank's
// vote per position, runs a position's group once every rank voted ready, and
// hands everything back to negotiation on any exit vote.
//
// Ownership: the Runtime owns one driver and outlives it; the driver borrows
// the runtime's parts (Parts) and reaches back only through Host.
// Threading: every method runs on the engine holder (Runtime's engine_mu_).
// Blocking: none. Waiting for votes is the engine's ordinary wait for control
// messages, bounded by BudgetMs().
#pragma once
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "coordinator/messages.h"
#include "coordinator/response_cache.h"
#include "coordinator/steady_state.h"
#include "coordinator/timeline.h"
#include "runtime/bootstrap.h"
#include "runtime/executor.h"
#include "runtime/tensor_queue.h"
#include "transport/transport.h"

namespace hvdlite {

class SteadyStateDriver {
 public:
  // What the driver asks of the runtime it belongs to.
  class Host {
   public:
    virtual ~Host() = default;
    // Leaving a schedule: send what this rank holds (TakeHeld) and anything
    // newer to the coordinator, as negotiation does.
    virtual Status SendNewRequests() = 0;
    // Takes in the control messages that already arrived, without waiting
    // (votes reach the driver through OnVoteMessage meanwhile).
    virtual Status DrainControl() = 0;
    // shutdown() was called on this rank.
    virtual bool ShuttingDown() const = 0;
    // Every rank leaves the schedule at this position (rank 0: the coordinator learns anew).
    virtual void ScheduleEnded() = 0;
  };
  // The runtime's parts the driver uses; all outlive it.
  struct Parts {
    const Config* cfg = nullptr;
    const Topology* topo = nullptr;
    Transport* transport = nullptr;
    Executor* executor = nullptr;
    TensorQueue* queue = nullptr;
    const LocalRequestCache* cache = nullptr;
    Timeline* timeline = nullptr;  // written only while Active() (rank 0)
    Host* host = nullptr;
  };
  explicit SteadyStateDriver(const Parts& parts);

  bool active() const { return steady_.active(); }
  // Schedule mode: takes the queue's new submissions and holds them.
  void HoldNewRequests();
  // After leaving: moves the held requests to the front of *fresh and, when
  // *has_waits is false, the held report of blocked callers into *waits.
  void TakeHeld(std::vector<Request>* fresh, RankWaits* waits, bool* has_waits);
  // A vote message from `peer` (the wire form of a Vote); takes the bytes,
  // which the schedule keeps where they arrived (no copy of an input).
  Status OnVoteMessage(int peer, std::string&& payload);
  // A schedule the coordinator announced with this turn's responses; it is
  // entered by EnterAnnounced once they have run.
  void Announce(int64_t epoch, std::vector<Response> schedule);
  // Votes when it can, then runs every position decided so far.
  Status Run();
  // End of a turn: enters the schedule announced in it, if any.
  Status EnterAnnounced();
  // Milliseconds the engine may sleep before the driver must look again.
  int BudgetMs() const;

 private:
  using Clock = std::chrono::steady_clock;
  bool ChooseVote(Vote* v);
  Status SendVote(Vote v);
  const Request* HeldBarrier() const;
  Status Flush();
  Status CountDeparted();
  // The steady clock, read at most once, on first use (Run's checks of one iteration).
  class LazyNow {
   public:
    Clock::time_point Get() {
      if (!read_) now_ = Clock::now(), read_ = true;
      return now_;
    }

   private:
    Clock::time_point now_;
    bool read_ = false;
  };
  Status CheckStall(LazyNow* clock);
  Status CheckVoteWait(LazyNow* clock);
  double FailAfterSeconds() const;
  Status RunScheduledGroup();
  Status RunScheduledBarrier();
  Status LeaveSchedule();
  double PatienceSeconds() const;

  static constexpr size_t kNamedRanks = 32;  // an error names at most this many missing ranks
  Parts p_;
  SteadySchedule steady_;
  std::vector<SteadySchedule::Outgoing> outgoing_;  // scratch for Flush (capacity kept)
  std::vector<Request> taken_;                      // scratch for TakeNew (capacity kept)
  std::vector<const char*> voted_inputs_;           // scratch: the inputs a group's votes carried
  std::vector<Request> held_;                       // submitted, not sent to the coordinator
  bool unexpected_held_ = false;                    // held_ has something the schedule does not expect
  RankWaits held_waits_;  // the blocked callers' report, when it changed in schedule mode
  bool held_has_waits_ = false;
  bool voted_barrier_ = false;     // this rank's last vote was barrier (CheckVoteWait's message)
  bool patience_started_ = false;  // this rank waits at the current position since patience_since_
  Clock::time_point patience_since_;
  bool aware_started_ = false;  // a vote at the current position is known here since aware_since_
  Clock::time_point aware_since_;
  Clock::time_point voted_at_, last_vote_warning_;  // this rank's vote at the current position
  int64_t announced_epoch_ = 0;                     // a schedule announced in this turn's responses,
  std::vector<Response> announced_;                 // entered once they have run
};

}  // namespace hvdlite
