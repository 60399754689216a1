// P2pEngine's point-to-point of CUDA tensors (p2p.h): matched on the control
// plane like host messages, moved by the NCCL module (GpuBackend::StartP2p).
//
// NCCL needs both sides of a pair to queue the pair's transfers on their
// communicator in one order. The pair's lower rank (its leader) decides that
// order: it queues a transfer right after sending the frame that lets the
// higher rank queue it too, and the higher rank queues each transfer when
// that frame arrives; frames between two ranks arrive in the order sent, so
// both queue in the leader's order. The hand-shake, for a transfer from S to R:
//  1. S announces the send: kP2pDeviceReady (process set, tag, bytes, id).
//  2. R matches it with a posted receive by (set, S, tag) as for host messages
//     (kept as unexpected until one is posted) and answers kP2pDeviceReply
//     (ok, or the error that failed the receive: a size or host/CUDA
//     mismatch). If R is the leader, it queues its receive right after.
//  3. On an ok reply, S queues its send; if S is the leader, it first sends
//     kP2pDeviceGo, on which R queues its receive.
// The leader sends its frame before queuing, since the pair's first transfer
// makes the pair's communicator and both sides must reach that set-up.
// A rank sending to itself matches locally and queues both sides as one
// grouped send and receive (NCCL's rule for a send to self).
//
// Frames: ready = kind u8, set i32, tag i32, bytes u64, id u64; reply and go
// = kind u8, id u64, status code u8, message (the rest).
//
// Bounds: a CUDA send waits for its receive, at most HVDLITE_TIMEOUT_SECONDS
// (then Timeout naming the pair and tag); a queued transfer that has not
// finished in that time fails with Timeout too (its peer failed to queue).
#include <cstring>

#include "runtime/p2p.h"

namespace hvdlite {
namespace {

constexpr size_t kReadyBytes = 1 + 4 + 4 + 8 + 8;
constexpr size_t kReplyHeaderBytes = 1 + 8 + 1;

}  // namespace

Status P2pEngine::AnnounceDevice(int peer, Pending* s) {
  const uint64_t id = next_device_id_++;
  ChunkHeader h{s->op.process_set, s->op.tag, s->op.bytes, 0};
  device_sends_[DeviceKey{peer, id}] = s;  // until answered (to itself: until matched), for its bound
  if (peer == rank_) return DeviceArrived(peer, h, id, s);
  std::string f(kReadyBytes, '\0');
  f[0] = static_cast<char>(ControlKind::kP2pDeviceReady);
  std::memcpy(&f[1], &h.process_set, 4);
  std::memcpy(&f[5], &h.tag, 4);
  std::memcpy(&f[9], &h.total, 8);
  std::memcpy(&f[17], &id, 8);
  return transport_->SendControl(peer, f);
}

Status P2pEngine::SendDeviceFrame(int peer, ControlKind kind, uint64_t id, const Status& st) {
  std::string f(kReplyHeaderBytes, '\0');
  f[0] = static_cast<char>(kind);
  std::memcpy(&f[1], &id, 8);
  f[9] = static_cast<char>(st.code());
  f += st.message();
  return transport_->SendControl(peer, f);
}

Status P2pEngine::OnDeviceControl(int peer, const std::string& payload) {
  const ControlKind kind = PeekControlKind(payload);
  if (kind == ControlKind::kP2pDeviceReady) {
    if (payload.size() != kReadyBytes) return Status::Internal("corrupt point-to-point announcement");
    ChunkHeader h;
    uint64_t id = 0;
    std::memcpy(&h.process_set, &payload[1], 4);
    std::memcpy(&h.tag, &payload[5], 4);
    std::memcpy(&h.total, &payload[9], 8);
    std::memcpy(&id, &payload[17], 8);
    return DeviceArrived(peer, h, id, nullptr);
  }
  if (payload.size() < kReplyHeaderBytes) return Status::Internal("corrupt point-to-point reply");
  uint64_t id = 0;
  std::memcpy(&id, &payload[1], 8);
  const auto code = static_cast<StatusCode>(static_cast<uint8_t>(payload[9]));
  const Status st = code == StatusCode::kOk ? Status::OK() : Status(code, payload.substr(kReplyHeaderBytes));
  std::map<DeviceKey, Pending*>& waiting =
      kind == ControlKind::kP2pDeviceReply ? device_sends_ : device_recvs_;
  auto it = waiting.find(DeviceKey{peer, id});
  if (it == waiting.end()) return Status::OK();  // it timed out here already
  Pending* p = it->second;
  waiting.erase(it);
  if (!st.ok()) {
    Finish(p, st);
    return Status::OK();
  }
  if (kind == ControlKind::kP2pDeviceReply && rank_ < peer) {  // the sender leads: let R queue, then queue
    HVD_RETURN_IF_ERROR(SendDeviceFrame(peer, ControlKind::kP2pDeviceGo, id, Status::OK()));
  }
  if (kind == ControlKind::kP2pDeviceReply) {
    StartDevice(p, nullptr, peer);
  } else {
    StartDevice(nullptr, p, peer);
  }
  return Status::OK();
}

// A CUDA send's announcement from `peer` (this rank itself: self_send is the
// send): matched with the oldest posted receive, or kept as unexpected.
Status P2pEngine::DeviceArrived(int peer, const ChunkHeader& h, uint64_t id, Pending* self_send) {
  for (auto it = posted_recvs_.begin(); it != posted_recvs_.end(); ++it) {
    Pending* r = *it;
    if (r->peer != peer || r->op.process_set != h.process_set || r->op.tag != h.tag) continue;
    posted_recvs_.erase(it);
    return MatchDevice(peer, r, id, h.total, self_send);
  }
  Unexpected u;
  u.peer = peer;
  u.process_set = h.process_set;
  u.tag = h.tag;
  u.total = h.total;
  u.got = h.total;  // nothing to wait for: the data stays on the sender's device
  u.device = true;
  u.device_id = id;
  u.self_send = self_send;
  unexpected_.push_back(std::move(u));
  return Status::OK();
}

Status P2pEngine::MatchDevice(int peer, Pending* r, uint64_t id, uint64_t total, Pending* self_send) {
  if (self_send != nullptr) device_sends_.erase(DeviceKey{peer, id});
  Status st;
  if (r->op.device < 0) {
    st = KindMismatch(*r, true);
  } else if (total != r->op.bytes) {
    st = SizeMismatch(*r, total);
  }
  if (!st.ok()) {
    Finish(r, st);
    if (self_send != nullptr) {
      Finish(self_send, st);
      return Status::OK();
    }
    return SendDeviceFrame(peer, ControlKind::kP2pDeviceReply, id, st);
  }
  if (self_send != nullptr) {
    StartDevice(self_send, r, peer);
    return Status::OK();
  }
  HVD_RETURN_IF_ERROR(SendDeviceFrame(peer, ControlKind::kP2pDeviceReply, id, Status::OK()));
  if (rank_ < peer) {
    StartDevice(nullptr, r, peer);  // this rank leads the pair: queue right after the reply
  } else {
    device_recvs_[DeviceKey{peer, id}] = r;  // the sender leads: queue on its go
  }
  return Status::OK();
}

// Queues this rank's side(s) of a matched transfer; a failure fails them.
void P2pEngine::StartDevice(Pending* send, Pending* recv, int peer) {
  GpuBackend* gpu = gpu_.load();
  Pending* any = send != nullptr ? send : recv;
  GpuP2p g;
  g.device = any->op.device;
  g.me = rank_;
  g.peer = peer;
  g.send_data = send != nullptr ? send->op.data : nullptr;
  g.recv_data = recv != nullptr ? recv->op.data : nullptr;
  g.bytes = any->op.bytes;
  DeviceTransfer t;
  Status st =
      gpu == nullptr ? Status::Internal("the NCCL module is not loaded") : gpu->StartP2p(g, &t.ticket);
  if (!st.ok()) {
    FinishDevice(send, recv, st);
    return;
  }
  t.send = send;
  t.recv = recv;
  t.peer = peer;
  t.since = Clock::now();
  device_running_.push_back(t);
}

void P2pEngine::FinishDevice(Pending* send, Pending* recv, const Status& st) {
  if (send != nullptr) Finish(send, st.ok() ? st : st.WithContext(Describe(*send)));
  if (recv != nullptr) Finish(recv, st.ok() ? st : st.WithContext(Describe(*recv)));
}

// Completes transfers the GPU finished; fails those past the timeout, and
// sends whose receiver has not answered within it (or has shut down).
void P2pEngine::PollDevice() {
  GpuBackend* gpu = gpu_.load();
  const Clock::time_point now = Clock::now();
  const auto waited = [&](Clock::time_point since) {
    return std::chrono::duration<double>(now - since).count() >= timeout_s_;
  };
  const std::string limit = std::to_string(static_cast<int>(timeout_s_)) + " s (HVDLITE_TIMEOUT_SECONDS)";
  for (size_t i = 0; i < device_running_.size();) {
    DeviceTransfer& t = device_running_[i];
    bool done = false;
    Status st = gpu->PollP2p(t.ticket, &done);
    if (!done && st.ok() && waited(t.since)) {
      st = Status::Timeout("the transfer with rank " + std::to_string(t.peer) +
                           " did not finish on the GPU in " + limit + "; did that rank fail?");
    }
    if (!done && st.ok()) {
      ++i;
      continue;
    }
    FinishDevice(t.send, t.recv, st);
    device_running_.erase(device_running_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  for (auto it = device_sends_.begin(); it != device_sends_.end();) {
    Pending* s = it->second;
    Status st;
    if (transport_->PeerDeparted(s->peer)) {
      st = Status::Aborted(Describe(*s) + ": rank " + std::to_string(s->peer) + " has shut down");
    } else if (waited(s->since)) {
      st = Status::Timeout(
          Describe(*s) + ": rank " + std::to_string(s->peer) + " posted no matching recv within " + limit +
          " (a CUDA send waits for its recv). Check that it calls recv with the same tag and "
          "process set");
    }
    if (st.ok()) {
      ++it;
      continue;
    }
    it = device_sends_.erase(it);
    if (s->peer == rank_) {  // to itself: its announcement waits among the unexpected messages
      unexpected_.remove_if([s](const Unexpected& u) { return u.self_send == s; });
    }
    Finish(s, st);
  }
}

Status P2pEngine::KindMismatch(const Pending& r, bool message_on_device) const {
  return Status::Mismatch(Describe(r) + ": the message sent is " +
                          (message_on_device ? "a CUDA tensor and the receiving tensor is in host memory"
                                             : "in host memory and the receiving tensor is a CUDA tensor") +
                          "; make both tensors CUDA tensors, or both host tensors");
}

}  // namespace hvdlite
