#include "runtime/p2p.h"

#include <algorithm>
#include <cstring>
#include <iterator>

#include "coordinator/messages.h"

namespace hvdlite {
namespace {

// Chunk frame: kind u8, process set i32, tag i32, total u64, offset u64, then
// the chunk's bytes. Acknowledgement: kind u8, bytes u64. Little-endian hosts
// only, as the rest of the wire (messages.cc).
constexpr size_t kChunkHeaderBytes = 1 + P2pChunkHeader::kWireBytes;
constexpr size_t kAckBytes = 1 + 8;

std::string AckFrame(uint64_t bytes) {
  std::string f(kAckBytes, '\0');
  f[0] = static_cast<char>(ControlKind::kP2pAck);
  std::memcpy(&f[1], &bytes, 8);
  return f;
}

}  // namespace

P2pEngine::P2pEngine(int rank, Transport* transport, ProcessSetTable* sets, HandleTable* handles,
                     TensorQueue* queue, double timeout_s, int64_t unexpected_limit)
    : rank_(rank),
      transport_(transport),
      sets_(sets),
      handles_(handles),
      queue_(queue),
      timeout_s_(timeout_s),
      unexpected_limit_(unexpected_limit),
      outboxes_(static_cast<size_t>(transport->size())),
      incoming_(static_cast<size_t>(transport->size())),
      arena_(transport, transport->size()) {}

bool P2pEngine::Owns(const std::string& payload) {
  const ControlKind k = PeekControlKind(payload);
  return k == ControlKind::kP2pChunk || k == ControlKind::kP2pAck || k == ControlKind::kP2pDeviceReady ||
         k == ControlKind::kP2pDeviceReply || k == ControlKind::kP2pDeviceGo ||
         k == ControlKind::kP2pArenaChunk || k == ControlKind::kP2pArenaFree;
}

Status P2pEngine::Post(Op op, int64_t* handle, bool* waits_for_peer) {
  *waits_for_peer = false;
  const char* what = op.send ? "send" : "recv";
  const std::string subject = std::string(what) + " of tensor '" + op.name + "'";
  const std::vector<int> members = sets_->Ranks(op.process_set);
  if (members.empty()) {
    return Status::InvalidArgument(subject + ": process set " + std::to_string(op.process_set) +
                                   " does not exist (was it removed?)");
  }
  if (sets_->MemberIndex(op.process_set, rank_) < 0) {
    return Status::InvalidArgument(subject + ": rank " + std::to_string(rank_) +
                                   " is not a member of process set " + std::to_string(op.process_set) +
                                   "; only members may send and receive in it");
  }
  if (op.peer < 0 || op.peer >= static_cast<int32_t>(members.size())) {
    return Status::InvalidArgument(subject + ": " + (op.send ? "dst " : "src ") + std::to_string(op.peer) +
                                   " is not a rank of process set " + std::to_string(op.process_set) +
                                   " (its ranks are 0.." + std::to_string(members.size() - 1) +
                                   "; ranks of a process set count its members, not the job)");
  }
  if (op.tag < 0) {
    return Status::InvalidArgument(subject + ": tag " + std::to_string(op.tag) +
                                   " is negative; use a tag >= 0");
  }
  Pending p;
  p.peer = members[static_cast<size_t>(op.peer)];
  *waits_for_peer = op.send && op.device < 0 && op.bytes > kQuickSendBytes && !arena_.Usable(p.peer);
  p.op = std::move(op);
  p.handle = handles_->Create();
  *handle = p.handle;
  if (!p.op.send) queue_->AddP2pRecv(p.handle, WaitKey{p.op.process_set, p.op.name, p.peer, p.op.tag});
  {
    std::lock_guard<std::mutex> lock(mu_);
    inbox_.push_back(new Pending(std::move(p)));
  }
  posted_.fetch_add(1, std::memory_order_seq_cst);
  return Status::OK();
}

Status P2pEngine::TakePosted() {
  std::vector<Pending*> fresh;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fresh.swap(inbox_);
    taken_ = posted_.load(std::memory_order_relaxed);
  }
  for (Pending* raw : fresh) {
    ops_.push_back(std::move(*raw));
    delete raw;
    Pending* p = &ops_.back();
    p->self = std::prev(ops_.end());
    p->since = Clock::now();
    if (p->op.send) {
      Outbox& box = outboxes_[static_cast<size_t>(p->peer)];
      box.sends.push_back(p);
      if (!box.active) {
        box.active = true;
        active_peers_.push_back(p->peer);
      }
    } else {
      HVD_RETURN_IF_ERROR(PostRecv(p));
    }
  }
  return Status::OK();
}

// A new receive takes the oldest unexpected message of its (set, peer, tag),
// complete or still arriving; otherwise it waits in posted_recvs_.
Status P2pEngine::PostRecv(Pending* r) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    Unexpected& u = *it;
    if (u.recv != nullptr || u.discard || u.peer != r->peer || u.process_set != r->op.process_set ||
        u.tag != r->op.tag)
      continue;
    if (u.device) {  // a CUDA send's announcement
      const uint64_t id = u.device_id, total = u.total;
      Pending* self_send = u.self_send;
      unexpected_.erase(it);
      return MatchDevice(r->peer, r, id, total, self_send);
    }
    if (r->op.device >= 0) {
      Finish(r, KindMismatch(*r, false));
      u.discard = true;
    } else if (u.total != r->op.bytes) {
      Finish(r, SizeMismatch(*r, u.total));
      u.discard = true;  // the failed receive consumed it
    } else {
      u.recv = r;
    }
    if (u.got == u.total) ReleaseUnexpected(it);
    return Status::OK();
  }
  posted_recvs_.push_back(r);
  return Status::OK();
}

// A complete unexpected message: copied into the receive that matched it (if
// any), then forgotten.
void P2pEngine::ReleaseUnexpected(std::list<Unexpected>::iterator it) {
  Unexpected& u = *it;
  if (u.recv != nullptr) {
    if (u.total > 0) std::memcpy(u.recv->op.data, u.bytes.get(), u.total);
    Finish(u.recv, Status::OK());
  }
  unexpected_bytes_ -= static_cast<int64_t>(u.total);
  unexpected_.erase(it);
}

Status P2pEngine::Progress() {
  if (HasNew()) HVD_RETURN_IF_ERROR(TakePosted());
  if (!device_running_.empty() || !device_sends_.empty()) PollDevice();
  bool sending = !device_running_.empty();
  for (size_t i = 0; i < active_peers_.size();) {
    const int peer = active_peers_[i];
    Outbox& box = outboxes_[static_cast<size_t>(peer)];
    if (!box.sends.empty()) HVD_RETURN_IF_ERROR(SendSome(peer, &box));
    if (arena_.held(peer) > 0 && transport_->PeerDeparted(peer)) arena_.PeerLeft(peer);
    if (box.sends.empty() && box.unacked == 0 && arena_.held(peer) == 0) {  // idle: off the list
      box.active = false;
      active_peers_[i] = active_peers_.back();
      active_peers_.pop_back();
      continue;
    }
    sending = true;
    ++i;
  }
  // Sending lasts a grace past the last acknowledgement: the receiver's report
  // that its receive completed (sent after that acknowledgement) must reach
  // the coordinator before this rank's report of being blocked can. An idle
  // engine that already said so reads no clock.
  if (!sending && !reported_sending_) {
    if (!posted_recvs_.empty()) CheckRecvDeadlines();
    return Status::OK();
  }
  const Clock::time_point now = Clock::now();
  if (sending) last_sending_ = now;
  reported_sending_ = sending || now - last_sending_ < kSendingGrace;
  queue_->SetP2pSending(reported_sending_);
  if (!posted_recvs_.empty()) CheckRecvDeadlines();
  return Status::OK();
}

bool P2pEngine::SendsQueued() const {
  for (int peer : active_peers_) {
    if (!outboxes_[static_cast<size_t>(peer)].sends.empty()) return true;
  }
  return false;
}

// Sends the peer's queued messages, in order, chunk by chunk while its window
// allows. A message to this rank itself is delivered whole, at once.
Status P2pEngine::SendSome(int peer, Outbox* box) {
  while (!box->sends.empty()) {
    Pending* s = box->sends.front();
    if (peer != rank_ && transport_->PeerDeparted(peer)) {  // it shut down: nobody will read this
      box->sends.pop_front();
      Finish(s, Status::Aborted(Describe(*s) + ": rank " + std::to_string(peer) + " has shut down"));
      continue;
    }
    if (s->op.device >= 0) {
      box->sends.pop_front();
      HVD_RETURN_IF_ERROR(AnnounceDevice(peer, s));
      continue;
    }
    ChunkHeader h{s->op.process_set, s->op.tag, s->op.bytes, s->done};
    if (peer == rank_) {
      HVD_RETURN_IF_ERROR(Deliver(peer, h, s->op.data, s->op.bytes));
      box->sends.pop_front();
      Finish(s, Status::OK());
      continue;
    }
    if (s->op.bytes - s->done > P2pArenaLane::kInlineBytes && arena_.Usable(peer)) {
      bool sent = false;
      HVD_RETURN_IF_ERROR(SendPiece(peer, box, s, &sent));
      if (!sent && arena_.Usable(peer)) return WaitForRoom(peer, box, *s);
      continue;  // sent, or the lane turned off: the control ring takes the rest
    }
    const size_t n = std::min(kChunkBytes, s->op.bytes - s->done);
    if (box->unacked > 0 && box->unacked + n > kWindowBytes) return WaitForRoom(peer, box, *s);
    std::string frame(kChunkHeaderBytes + n, '\0');
    frame[0] = static_cast<char>(ControlKind::kP2pChunk);
    h.Write(&frame[1]);
    if (n > 0) std::memcpy(&frame[kChunkHeaderBytes], s->op.data + s->done, n);
    HVD_RETURN_IF_ERROR(transport_->SendControl(peer, frame));
    box->unacked += n;
    s->done += n;
    if (s->done == s->op.bytes) {
      box->sends.pop_front();
      Finish(s, Status::OK());
    }
  }
  return Status::OK();
}

// The next piece of `s` through the arena (*sent false: no room now, or the
// lane just turned off; the caller retries later or uses the control ring).
Status P2pEngine::SendPiece(int peer, Outbox* box, Pending* s, bool* sent) {
  const ChunkHeader h{s->op.process_set, s->op.tag, s->op.bytes, s->done};
  const size_t n = std::min(arena_.piece_bytes(), s->op.bytes - s->done);
  HVD_RETURN_IF_ERROR(arena_.Send(peer, h, s->op.data + s->done, n, sent));
  if (!*sent) return Status::OK();
  box->waiting_since = Clock::time_point{};
  s->done += n;
  if (s->done == s->op.bytes) {
    box->sends.pop_front();
    Finish(s, Status::OK());
  }
  return Status::OK();
}

// The peer's window (or the arena) is full: wait for it to take data in, at
// most HVDLITE_TIMEOUT_SECONDS from when the wait began.
Status P2pEngine::WaitForRoom(int peer, Outbox* box, const Pending& s) {
  const Clock::time_point now = Clock::now();
  if (box->waiting_since == Clock::time_point{}) box->waiting_since = now;
  if (std::chrono::duration<double>(now - box->waiting_since).count() >= timeout_s_) {
    return Status::Timeout(Describe(s) + ": rank " + std::to_string(peer) + " has taken in no data for " +
                           std::to_string(static_cast<int>(timeout_s_)) +
                           " s (HVDLITE_TIMEOUT_SECONDS); is it hung?");
  }
  return Status::OK();
}

Status P2pEngine::OnControl(int peer, const std::string& payload) {
  Outbox& box = outboxes_[static_cast<size_t>(peer)];
  const ControlKind kind = PeekControlKind(payload);
  if (kind == ControlKind::kP2pArenaChunk) return OnArenaChunk(peer, payload);
  if (kind == ControlKind::kP2pArenaFree) {
    box.waiting_since = Clock::time_point{};
    return arena_.OnFree(peer, payload);
  }
  if (kind != ControlKind::kP2pAck && kind != ControlKind::kP2pChunk) return OnDeviceControl(peer, payload);
  if (kind == ControlKind::kP2pAck) {
    uint64_t bytes = 0;
    if (payload.size() != kAckBytes) return Status::Internal("corrupt point-to-point acknowledgement");
    std::memcpy(&bytes, &payload[1], 8);
    box.unacked -= std::min<size_t>(box.unacked, bytes);
    box.waiting_since = Clock::time_point{};
    return Status::OK();
  }
  if (payload.size() < kChunkHeaderBytes) return Status::Internal("corrupt point-to-point chunk");
  const ChunkHeader h = ChunkHeader::Read(&payload[1]);
  const size_t len = payload.size() - kChunkHeaderBytes;
  HVD_RETURN_IF_ERROR(Deliver(peer, h, payload.data() + kChunkHeaderBytes, len));
  if (transport_->PeerDeparted(peer)) return Status::OK();  // it sent everything and left: no ack
  return transport_->SendControl(peer, AckFrame(len));
}

// A piece in `peer`'s arena: copied out where it belongs, then freed.
Status P2pEngine::OnArenaChunk(int peer, const std::string& payload) {
  ChunkHeader h;
  const char* bytes = nullptr;
  size_t len = 0;
  uint64_t at = 0;
  HVD_RETURN_IF_ERROR(arena_.Open(peer, payload, &h, &bytes, &len, &at));
  HVD_RETURN_IF_ERROR(Deliver(peer, h, bytes, len));
  if (transport_->PeerDeparted(peer)) return Status::OK();  // it reclaims nothing any more
  return arena_.Release(peer, at);
}

// One chunk from `peer` (offsets follow each other within a message).
Status P2pEngine::Deliver(int peer, const ChunkHeader& h, const char* payload, size_t len) {
  Incoming& in = incoming_[static_cast<size_t>(peer)];
  if (h.offset == 0) {
    HVD_RETURN_IF_ERROR(StartMessage(peer, h, &in));
  } else if (!in.active || h.offset != in.got || h.total != in.header.total) {
    return Status::Internal("point-to-point stream from rank " + std::to_string(peer) + " is out of order");
  }
  if (len > h.total - in.got) {
    return Status::Internal("point-to-point chunk from rank " + std::to_string(peer) +
                            " overruns its message");
  }
  if (in.recv != nullptr && len > 0) {
    std::memcpy(in.recv->op.data + in.got, payload, len);
  } else if (in.has_unexpected && len > 0) {
    std::memcpy(in.unexpected->bytes.get() + in.got, payload, len);
  }
  in.got += len;
  if (in.has_unexpected) in.unexpected->got = in.got;
  if (in.got < h.total) return Status::OK();
  in.active = false;
  if (in.recv != nullptr) Finish(in.recv, Status::OK());
  if (in.has_unexpected && (in.unexpected->recv != nullptr || in.unexpected->discard)) {
    ReleaseUnexpected(in.unexpected);
  }
  in.recv = nullptr;
  in.has_unexpected = false;
  return Status::OK();
}

// The first chunk of a message: match it with the oldest posted receive of
// its (set, peer, tag), or keep it as unexpected.
Status P2pEngine::StartMessage(int peer, const ChunkHeader& h, Incoming* in) {
  if (in->active) {
    return Status::Internal("point-to-point message from rank " + std::to_string(peer) +
                            " started before the previous one ended");
  }
  in->active = true;
  in->header = h;
  in->got = 0;
  in->recv = nullptr;
  in->has_unexpected = false;
  for (auto it = posted_recvs_.begin(); it != posted_recvs_.end(); ++it) {
    Pending* r = *it;
    if (r->peer != peer || r->op.process_set != h.process_set || r->op.tag != h.tag) continue;
    posted_recvs_.erase(it);
    if (r->op.device >= 0 || r->op.bytes != h.total) {
      Finish(r, r->op.device >= 0 ? KindMismatch(*r, false) : SizeMismatch(*r, h.total));
      return Status::OK();  // the failed receive consumed it: its chunks are dropped
    }
    in->recv = r;
    return Status::OK();
  }
  if (unexpected_bytes_ + static_cast<int64_t>(h.total) > unexpected_limit_) {
    return Status::Precondition(
        "rank " + std::to_string(rank_) + " holds " + std::to_string(unexpected_bytes_) +
        " bytes of point-to-point messages no receive has matched yet; the next one, from rank " +
        std::to_string(peer) + " with tag " + std::to_string(h.tag) + " (process set " +
        std::to_string(h.process_set) + ", " + std::to_string(h.total) +
        " bytes), would pass HVDLITE_P2P_UNEXPECTED_BYTES (" + std::to_string(unexpected_limit_) +
        "): post the matching recv sooner, or raise the limit");
  }
  Unexpected u;
  u.peer = peer;
  u.process_set = h.process_set;
  u.tag = h.tag;
  u.total = h.total;
  u.bytes.reset(new char[std::max<uint64_t>(h.total, 1)]);
  unexpected_bytes_ += static_cast<int64_t>(h.total);
  unexpected_.push_back(std::move(u));
  in->unexpected = std::prev(unexpected_.end());
  in->has_unexpected = true;
  return Status::OK();
}

void P2pEngine::FailDeadlocked(int32_t process_set, const std::string& name, int src, int32_t tag,
                               const Status& why) {
  for (auto it = posted_recvs_.begin(); it != posted_recvs_.end(); ++it) {
    Pending* r = *it;
    if (r->peer != src || r->op.process_set != process_set || r->op.tag != tag || r->op.name != name)
      continue;
    posted_recvs_.erase(it);
    Finish(r, why);
    return;
  }
}

void P2pEngine::Finish(Pending* p, Status st) {
  if (!p->op.send) queue_->EndP2pRecv(p->handle);
  HandleResult r;
  r.status = std::move(st);
  handles_->Complete(p->handle, std::move(r));
  ops_.erase(p->self);
}

Status P2pEngine::SizeMismatch(const Pending& r, uint64_t total) const {
  return Status::Mismatch(Describe(r) + ": the message sent has " + std::to_string(total) +
                          " bytes, the receiving tensor " + std::to_string(r.op.bytes) +
                          "; make both tensors the same shape and dtype");
}

std::string P2pEngine::Describe(const Pending& p) const {
  std::string peer = "rank " + std::to_string(p.peer);
  if (p.op.process_set != 0) {
    peer +=
        " (rank " + std::to_string(p.op.peer) + " of process set " + std::to_string(p.op.process_set) + ")";
  }
  std::string s =
      p.op.send ? "send of tensor '" + p.op.name + "' from rank " + std::to_string(rank_) + " to " + peer
                : "recv of tensor '" + p.op.name + "' on rank " + std::to_string(rank_) + " from " + peer;
  return s + " with tag " + std::to_string(p.op.tag);
}

std::string P2pEngine::UnreceivedTags(int peer, int32_t process_set) const {
  std::string tags;
  for (const Unexpected& u : unexpected_) {
    if (u.peer != peer || u.process_set != process_set || u.recv != nullptr || u.discard) continue;
    tags += (tags.empty() ? "" : ", ") + std::to_string(u.tag);
  }
  return tags.empty() ? "none" : tags;
}

// Receives whose sender shut down, or that waited HVDLITE_TIMEOUT_SECONDS for
// a message, fail (the rest of the job goes on).
void P2pEngine::CheckRecvDeadlines() {
  const Clock::time_point now = Clock::now();
  for (auto it = posted_recvs_.begin(); it != posted_recvs_.end();) {
    Pending* r = *it;
    Status st;
    if (r->peer != rank_ && transport_->PeerDeparted(r->peer)) {
      st = Status::Aborted(Describe(*r) + ": rank " + std::to_string(r->peer) +
                           " has shut down without sending a matching message");
    } else if (std::chrono::duration<double>(now - r->since).count() >= timeout_s_) {
      st =
          Status::Timeout(Describe(*r) + ": unmatched after " + std::to_string(static_cast<int>(timeout_s_)) +
                          " s (HVDLITE_TIMEOUT_SECONDS): rank " + std::to_string(r->peer) +
                          " sent no message with this tag; tags received from it and not matched: " +
                          UnreceivedTags(r->peer, r->op.process_set) + ". Check that the sender calls " +
                          "send with the same tag and process set");
    }
    if (st.ok()) {
      ++it;
      continue;
    }
    it = posted_recvs_.erase(it);
    Finish(r, st);
  }
}

}  // namespace hvdlite
