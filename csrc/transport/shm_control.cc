// ShmTransport control plane (control channels, WaitControl) and lifecycle.
#include <chrono>
#include <sstream>

#include "common/deadline.h"
#include "transport/shm_transport.h"

namespace hvdlite {

int ShmTransport::linked_peers() const { return static_cast<int>(linked_ids_.size()); }

Status ShmTransport::OnControlPiece(int peer, const shm::SlotHeader& h, const char* payload) {
  std::string& partial = links_[peer].ctrl_partial;
  if (h.kind != shm::kControlPiece || h.offset != partial.size() || h.msg_len > kMaxControlLen ||
      h.len > h.msg_len - h.offset) {
    std::ostringstream os;
    os << "rank " << rank() << " received a corrupt control piece from rank " << peer << " (kind " << h.kind
       << ", offset " << h.offset << " of " << h.msg_len << ")";
    return Status::Internal(os.str());
  }
  if (h.offset == 0) partial.reserve(h.msg_len);
  partial.append(payload, h.len);
  if (partial.size() == h.msg_len) {
    ctrl_queue_.push_back(ControlMessage{peer, std::move(partial)});
    partial = std::string();
  }
  return Status::OK();
}

// Empties every linked peer's control channel into ctrl_queue_ (and wakes a
// sender that waits for room).
Status ShmTransport::DrainControl() {
  for (int q : linked_ids_) {
    Link& l = links_[q];
    bool released = false;
    const char* payload = nullptr;
    while (const shm::SlotHeader* slot = l.ctrl_in.Peek(&payload)) {
      const shm::SlotHeader h = *slot;
      HVD_RETURN_IF_ERROR(OnControlPiece(q, h, payload));
      l.ctrl_in.Release();
      released = true;
    }
    if (released) NudgeIfSleeping(q);
  }
  return Status::OK();
}

Status ShmTransport::SendControl(int peer, const std::string& payload) {
  if (!base_->broken().ok()) return base_->broken();
  HVD_RETURN_IF_ERROR(CheckPeer(peer, "control"));
  if (!Linked(peer)) return base_->SendControl(peer, payload);
  if (payload.size() > kMaxControlLen) return Status::InvalidArgument("control message larger than 1 GiB");
  Transfer t;
  t.ss = SendOp::Control(peer, payload);
  Status st = Run(&t);
  return st.ok() ? st : Fail(st);
}

// Returns what is queued or in the control channels at once; otherwise (with
// timeout_ms > 0) sleeps in the base's WaitEvents (its connections and
// wake_fd) with this rank's sleeping flag set, so a peer that publishes
// control nudges it awake. timeout_ms == 0 is a cheap poll of the channels,
// for callers that spin: it looks at the base only every millisecond (or
// always, when some peers are reached through it), so a spinning caller makes
// almost no syscalls.
Status ShmTransport::WaitControl(int wake_fd, int timeout_ms, std::vector<ControlMessage>* out) {
  if (!base_->broken().ok()) return base_->broken();
  if (timeout_ms < 0) return Status::InvalidArgument("WaitControl needs a bounded timeout_ms");
  Status st = DrainControl();
  if (st.ok() && ctrl_queue_.empty() && timeout_ms == 0) {
    const auto now = std::chrono::steady_clock::now();
    const bool remote_peers = linked_peers() < size() - 1;
    if (remote_peers || now - last_socket_check_ >= std::chrono::milliseconds(1)) {
      last_socket_check_ = now;
      bool woken = false;
      st = base_->WaitEvents(-1, 0, -1, -1, &base_ctrl_, &woken);
    }
  } else if (st.ok() && ctrl_queue_.empty()) {
    Deadline deadline = Deadline::After(timeout_ms / 1000.0);
    bool woken = false;
    while (st.ok() && ctrl_queue_.empty() && base_ctrl_.empty() && !woken && !deadline.expired()) {
      sleeping_->store(1, std::memory_order_seq_cst);
      std::atomic_thread_fence(std::memory_order_seq_cst);
      st = DrainControl();
      if (st.ok() && ctrl_queue_.empty())
        st = base_->WaitEvents(wake_fd, deadline.RemainingMs(), -1, -1, &base_ctrl_, &woken);
      sleeping_->store(0, std::memory_order_relaxed);
      if (st.ok()) st = DrainControl();
    }
  }
  if (!st.ok()) return Fail(st);
  for (auto& m : base_ctrl_) ctrl_queue_.push_back(std::move(m));
  base_ctrl_.clear();
  while (!ctrl_queue_.empty()) {
    out->push_back(std::move(ctrl_queue_.front()));
    ctrl_queue_.pop_front();
  }
  return Status::OK();
}

void ShmTransport::Close() {
  if (closed_) return;
  closed_ = true;
  base_->Close();  // the segments stay mapped until destruction: nothing reads them after this
}

}  // namespace hvdlite
