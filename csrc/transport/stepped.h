// SteppedTransport: a Transport whose transfers can also be driven one
// non-blocking step at a time by a caller that owns the loop.
//
// Private to csrc/transport. The shared-memory transport runs its own loop
// over its rings and, in the same loop, steps a SteppedTransport for peers it
// cannot reach through shared memory; it also sleeps in that transport's
// WaitEvents (its sockets carry liveness and the NUDGE doorbell). That is all
// it knows of the transport beneath it: TcpTransport implements this
// interface, and only the factory (CreateShmTransport in transport.cc) names
// both.
//
// The per-operation state (SendOp, RecvOp) is declared here once and used by
// every transport that progresses a message in pieces. An op is plain data:
// the caller owns it and the buffers it points to, which must stay valid until
// the op is done or the transfer has failed.
//
// Threading: as Transport (one thread at a time, the same thread for the
// stepping calls and every other call).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transport/transport.h"

namespace hvdlite {

// Which plane a message belongs to (each transport maps it to its framing).
enum class MessageKind : uint32_t { kData, kControl };

// One outgoing message, progressed piece by piece. peer == -1 (done) means no
// send. `sent` counts payload bytes handed on; header_sent counts the bytes of
// a transport's own frame header already written (TCP; unused elsewhere).
struct SendOp {
  int peer = -1;
  MessageKind kind = MessageKind::kData;
  uint32_t tag = 0;  // data tag (0 for control)
  const char* data = nullptr;
  size_t len = 0;
  size_t sent = 0;  // an empty message still takes one step
  size_t header_sent = 0;
  bool done = true;  // nothing left to send (also an op with no peer)

  // A data message `len` bytes long to `peer`; peer -1 gives an op already done.
  static SendOp Data(int peer, uint32_t tag, const void* data, size_t len) {
    SendOp s;
    if (peer == -1) return s;
    s.peer = peer;
    s.tag = tag;
    s.data = static_cast<const char*>(data);
    s.len = len;
    s.done = false;
    return s;
  }
  // A control message (the payload string must outlive the op).
  static SendOp Control(int peer, const std::string& payload) {
    SendOp s = Data(peer, 0, payload.data(), payload.size());
    s.kind = MessageKind::kControl;
    return s;
  }
};

// One incoming data message, copied into `data` or, with a reducer, reduced
// into it. peer == -1 (done) means no receive.
struct RecvOp {
  int peer = -1;
  uint32_t tag = 0;
  char* data = nullptr;
  size_t len = 0;
  size_t got = 0;                    // payload bytes received (copied or staged for reduction)
  bool checked = false;              // the message's header matched tag and length (TCP)
  bool done = true;                  // nothing left to receive (also an op with no peer)
  const Reducer* reducer = nullptr;  // reduce into data instead of copying (not owned)
  size_t reduced = 0;                // bytes of data already reduced (TCP stages pieces in scratch)

  static RecvOp Data(int peer, uint32_t tag, void* data, size_t len, const Reducer* reducer) {
    RecvOp r;
    if (peer == -1) return r;
    r.peer = peer;
    r.tag = tag;
    r.data = static_cast<char*>(data);
    r.len = len;
    r.reducer = reducer;
    r.done = false;
    return r;
  }
};

class SteppedTransport : public Transport {
 public:
  // Moves what can move for `s` and `r` (either may be done already) without
  // blocking (except that a send to a peer with no connection yet first opens
  // one, bounded by the transport's connect timeout); sets *progressed when a byte moved. Peers must be valid
  // ranks other than this one. Errors are returned unrecorded: the caller decides, usually through Abort.
  virtual Status StepOps(SendOp* s, RecvOp* r, bool* progressed) = 0;
  // The Timeout status for `s` and `r` having made no progress for the
  // transport's io_timeout_s (names the peers, tags and byte counts).
  virtual Status TimeoutError(const SendOp& s, const RecvOp& r) const = 0;

  // Like WaitControl (appends complete control messages to `out`; bounded by
  // timeout_ms >= 0), but also returns as soon as anything arrives from any
  // peer (a Nudge, the start of a data message) or, when writable_peer >= 0,
  // that peer can take more bytes, or, when readable_peer >= 0, more bytes of
  // the data message being received from that peer arrived. *woken is set when
  // wake_fd fired. A peer that died ends the wait with Aborted naming it.
  virtual Status WaitEvents(int wake_fd, int timeout_ms, int writable_peer, int readable_peer,
                            std::vector<ControlMessage>* out, bool* woken) = 0;
  // Wakes `peer` if it sleeps in WaitEvents. Best effort and never blocking: a
  // sleeper also wakes on its own timeout.
  virtual void Nudge(int peer) = 0;
  // True once a departed peer's connection is gone (it will send nothing more).
  virtual bool PeerClosed(int peer) const = 0;

  // Marks the transport broken with `st` (unless already broken), tells the
  // peers, and returns the first error.
  virtual Status Abort(const Status& st) = 0;
  // OK, or the first error (every later call fails with it).
  virtual const Status& broken() const = 0;
};

}  // namespace hvdlite
