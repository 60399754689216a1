// ShmTransport data path: Send / Recv / SendRecv(Reduce) through the rings,
// with a side through the base transport (stepped.h) when a peer is not linked. Control plane and lifecycle:
// shm_control.cc; setup: shm_setup.cc.
#include "transport/shm_transport.h"

#include <chrono>
#include <cstring>
#include <sstream>

#include "common/spin.h"

namespace hvdlite {

ShmTransport::ShmTransport(std::unique_ptr<SteppedTransport> base, shm::Segment own,
                           std::vector<shm::Segment> mapped, std::vector<Link> links, const ShmOptions& opts,
                           double io_timeout_s, bool oversubscribed)
    : base_(std::move(base)),
      own_(std::move(own)),
      mapped_(std::move(mapped)),
      links_(std::move(links)),
      opts_(opts),
      io_timeout_s_(io_timeout_s),
      yield_(oversubscribed),
      data_spin_(oversubscribed ? opts.spin_us * kYieldSpinFactor : opts.spin_us),
      sleeping_(&own_.header()->sleeping) {
  for (int r = 0; r < static_cast<int>(links_.size()); ++r) {
    if (links_[r].linked) linked_ids_.push_back(r);
  }
}

ShmTransport::~ShmTransport() { Close(); }

Status ShmTransport::CheckPeer(int peer, const char* what) const {
  if (peer < 0 || peer >= size() || peer == rank()) {
    std::ostringstream os;
    os << "rank " << rank() << ": invalid " << what << " peer " << peer << " (size " << size() << ")";
    return Status::InvalidArgument(os.str());
  }
  return Status::OK();
}

Status ShmTransport::Send(int peer, uint32_t tag, const void* data, size_t len) {
  return Exchange(peer, tag, data, len, -1, 0, nullptr, 0, nullptr);
}

Status ShmTransport::Recv(int peer, uint32_t tag, void* data, size_t len) {
  return Exchange(-1, 0, nullptr, 0, peer, tag, data, len, nullptr);
}

Status ShmTransport::SendRecv(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                              int recv_peer, uint32_t recv_tag, void* recv_data, size_t recv_len) {
  return Exchange(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag, recv_data, recv_len,
                  nullptr);
}

Status ShmTransport::SendRecvReduce(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                                    int recv_peer, uint32_t recv_tag, void* recv_dst, size_t recv_len,
                                    const Reducer& reducer) {
  return Exchange(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag, recv_dst, recv_len,
                  &reducer);
}

Status ShmTransport::SendRecvPair(const ExchangeSpec& a, const ExchangeSpec& b) {
  const auto shm_side = [this](const ExchangeSpec& e) {
    return (e.send_peer == -1 || Linked(e.send_peer)) && (e.recv_peer == -1 || Linked(e.recv_peer));
  };
  const auto base_side = [this](const ExchangeSpec& e) {
    return (e.send_peer == -1 || (e.send_peer != rank() && e.send_peer >= 0 && !Linked(e.send_peer))) &&
           (e.recv_peer == -1 || (e.recv_peer != rank() && e.recv_peer >= 0 && !Linked(e.recv_peer)));
  };
  if (!shm_side(a) || !base_side(b)) return Transport::SendRecvPair(a, b);
  if (!base_->broken().ok()) return base_->broken();
  for (int peer : {a.send_peer, a.recv_peer, b.send_peer, b.recv_peer})
    if (peer != -1) HVD_RETURN_IF_ERROR(CheckPeer(peer, "exchange with"));
  Transfer t;
  t.ss = SendOp::Data(a.send_peer, a.send_tag, a.send_data, a.send_len);
  t.sr = RecvOp::Data(a.recv_peer, a.recv_tag, a.recv_data, a.recv_len, a.reducer);
  t.bs = SendOp::Data(b.send_peer, b.send_tag, b.send_data, b.send_len);
  t.br = RecvOp::Data(b.recv_peer, b.recv_tag, b.recv_data, b.recv_len, b.reducer);
  Status st = Run(&t);
  return st.ok() ? st : Fail(st);
}

// A rank exchanging with itself: a plain copy (or reduction).
Status ShmTransport::SelfExchange(uint32_t send_tag, const void* send_data, size_t send_len,
                                  uint32_t recv_tag, void* recv_data, size_t recv_len,
                                  const Reducer* reducer) {
  if (send_tag != recv_tag || send_len != recv_len) {
    std::ostringstream os;
    os << "rank " << rank() << " sends itself tag " << send_tag << " (" << send_len
       << " bytes) but expects tag " << recv_tag << " (" << recv_len << " bytes)";
    return Fail(Status::Internal(os.str()));
  }
  if (send_len == 0 || send_data == recv_data) return Status::OK();
  if (reducer != nullptr) return reducer->fn(reducer->ctx, recv_data, send_data, send_len);
  std::memmove(recv_data, send_data, send_len);
  return Status::OK();
}

Status ShmTransport::Exchange(int send_peer, uint32_t send_tag, const void* send_data, size_t send_len,
                              int recv_peer, uint32_t recv_tag, void* recv_data, size_t recv_len,
                              const Reducer* reducer) {
  if (!base_->broken().ok()) return base_->broken();
  if (send_peer == rank() && recv_peer == rank()) {
    return SelfExchange(send_tag, send_data, send_len, recv_tag, recv_data, recv_len, reducer);
  }
  if (send_peer != -1) HVD_RETURN_IF_ERROR(CheckPeer(send_peer, "send"));
  if (recv_peer != -1) HVD_RETURN_IF_ERROR(CheckPeer(recv_peer, "receive"));
  const bool shm_send = Linked(send_peer), shm_recv = Linked(recv_peer);
  if (!shm_send && !shm_recv) {  // both sides (or the only one) through the base: its own loop
    return reducer ? base_->SendRecvReduce(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag,
                                           recv_data, recv_len, *reducer)
                   : base_->SendRecv(send_peer, send_tag, send_data, send_len, recv_peer, recv_tag, recv_data,
                                     recv_len);
  }
  Transfer t;
  (shm_send ? t.ss : t.bs) = SendOp::Data(send_peer, send_tag, send_data, send_len);
  (shm_recv ? t.sr : t.br) = RecvOp::Data(recv_peer, recv_tag, recv_data, recv_len, reducer);
  Status st = Run(&t);
  return st.ok() ? st : Fail(st);
}

// Progresses the transfer until done: poll without syscalls for the spin
// budget after the last progress, then sleep (Sleep) until nudged, a socket
// event or 50 ms; fails when nothing moved for io_timeout_s, counted from the
// first pass after the last progress that moved nothing (so a transfer that
// never stalls, such as a vote, reads no clock).
Status ShmTransport::Run(Transfer* t) {
  using Clock = std::chrono::steady_clock;
  Spinner spin(&data_spin_, yield_);
  bool stalled = false;  // since stalled_since
  Clock::time_point stalled_since;
  for (;;) {
    bool progressed = false;
    HVD_RETURN_IF_ERROR(Step(t, &progressed));
    if (t->done()) {
      spin.Reset();
      return Status::OK();
    }
    if (progressed) {
      spin.Reset();
      stalled = false;
      continue;
    }
    HVD_RETURN_IF_ERROR(DrainControl());
    const Clock::time_point now = Clock::now();
    if (!stalled) {
      stalled = true;
      stalled_since = now;
    }
    if (std::chrono::duration<double>(now - stalled_since).count() >= io_timeout_s_) {
      return TimeoutError(*t);
    }
    if (spin.Spin()) continue;
    HVD_RETURN_IF_ERROR(Sleep(t));
  }
}

// One round: at most one slot each way through shared memory (so sending and
// receiving interleave finely and both rings stay busy), plus whatever the
// base's side can move without blocking.
Status ShmTransport::Step(Transfer* t, bool* progressed) {
  if (!t->ss.done && Push(&t->ss)) *progressed = true;
  if (!t->sr.done) HVD_RETURN_IF_ERROR(Pull(&t->sr, progressed));
  if (!t->bs.done || !t->br.done) HVD_RETURN_IF_ERROR(base_->StepOps(&t->bs, &t->br, progressed));
  return Status::OK();
}

// Copies the next piece of `s` into a free slot, if there is one.
bool ShmTransport::Push(SendOp* s) {
  Link& l = links_[s->peer];
  const bool control = s->kind == MessageKind::kControl;
  shm::Producer& out = control ? l.ctrl_out : l.data_out;
  char* payload = nullptr;
  shm::SlotHeader* h = out.Acquire(&payload);
  if (h == nullptr) return false;
  const size_t n = std::min(out.slot_bytes(), s->len - s->sent);
  if (n > 0) std::memcpy(payload, s->data + s->sent, n);
  h->tag = s->tag;
  h->kind = control ? shm::kControlPiece : shm::kDataPiece;
  h->msg_len = s->len;
  h->offset = s->sent;
  h->len = n;
  out.Publish();
  s->sent += n;
  s->done = s->sent == s->len;
  NudgeIfSleeping(s->peer);
  return true;
}

// Copies (or reduces) the next piece for `r` out of its slot, if one is there.
Status ShmTransport::Pull(RecvOp* r, bool* progressed) {
  Link& l = links_[r->peer];
  const char* payload = nullptr;
  const shm::SlotHeader* slot = l.data_in.Peek(&payload);
  if (slot == nullptr) return Status::OK();
  const shm::SlotHeader h = *slot;
  if (h.kind != shm::kDataPiece || h.tag != r->tag || h.msg_len != r->len || h.offset != r->got ||
      h.len > r->len - r->got || (h.len == 0 && r->len != 0)) {
    std::ostringstream os;
    os << "rank " << rank() << " expected data tag " << r->tag << " (" << r->len << " bytes) from rank "
       << r->peer << " but received tag " << h.tag << " (" << h.msg_len
       << " bytes): the ranks disagree on the order of operations";
    return Status::Internal(os.str());
  }
  if (h.len > 0) {
    if (r->reducer != nullptr) {
      HVD_RETURN_IF_ERROR(r->reducer->fn(r->reducer->ctx, r->data + r->got, payload, h.len));
    } else {
      std::memcpy(r->data + r->got, payload, h.len);
    }
  }
  l.data_in.Release();
  r->got += h.len;
  r->done = r->got == r->len;
  *progressed = true;
  NudgeIfSleeping(r->peer);  // its sender may be waiting for this slot
  return Status::OK();
}

// Publishes or releases must be visible before the peer's flag is read, and
// the sleeper sets its flag before it re-checks the rings (Sleep): with a
// full fence on both sides, either the sleeper sees the slot or we see the flag.
void ShmTransport::NudgeIfSleeping(int peer) {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (links_[peer].peer_sleeping->load(std::memory_order_relaxed) != 0) base_->Nudge(peer);
}

Status ShmTransport::Sleep(Transfer* t) {
  sleeping_->store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  bool progressed = false;
  Status st = Step(t, &progressed);
  if (st.ok()) st = DrainControl();
  if (st.ok() && !progressed && !t->done()) {
    bool woken = false;
    st = base_->WaitEvents(-1, 50, t->bs.done ? -1 : t->bs.peer, t->br.done ? -1 : t->br.peer, &base_ctrl_,
                           &woken);
    for (auto& m : base_ctrl_) ctrl_queue_.push_back(std::move(m));
    base_ctrl_.clear();
    if (st.ok()) st = PeersAlive(*t);
  }
  sleeping_->store(0, std::memory_order_relaxed);
  return st;
}

// A linked peer that shut down on purpose (DEPART, then its socket closed)
// will never move our transfer along. A crashed one is reported by WaitEvents.
Status ShmTransport::PeersAlive(const Transfer& t) const {
  for (int peer : {t.ss.done ? -1 : t.ss.peer, t.sr.done ? -1 : t.sr.peer}) {
    if (peer >= 0 && base_->PeerClosed(peer))
      return Status::Aborted("rank " + std::to_string(peer) + " has shut down");
  }
  return Status::OK();
}

Status ShmTransport::TimeoutError(const Transfer& t) const {
  if (t.ss.done && t.sr.done) return base_->TimeoutError(t.bs, t.br);
  std::ostringstream os;
  os << "rank " << rank() << ": no data moved for " << io_timeout_s_ << "s while";
  if (!t.ss.done) {
    os << " sending to rank " << t.ss.peer << " ("
       << (t.ss.kind == MessageKind::kControl ? "control" : "tag " + std::to_string(t.ss.tag)) << ", "
       << t.ss.sent << " of " << t.ss.len << " bytes sent)";
  }
  if (!t.ss.done && !t.sr.done) os << " and";
  if (!t.sr.done) {
    os << " receiving from rank " << t.sr.peer << " (tag " << t.sr.tag << ", " << t.sr.got << " of "
       << t.sr.len << " bytes received)";
  }
  os << " through shared memory; is that rank stalled, or did it skip this operation?";
  return Status::Timeout(os.str());
}

}  // namespace hvdlite
