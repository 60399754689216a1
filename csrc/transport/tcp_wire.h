// Wire format of the TCP transport (private to csrc/transport).
//
// After the handshake (tcp_connect.cc) a connection carries frames:
//   [u32 kind][u32 tag][u64 length] payload
// in host byte order (every supported platform is little-endian).
//   DATA     tag = the data tag, payload = the message (read straight into the
//            receiver's buffer)
//   CONTROL  tag = 0, payload = one control message
//   DEPART   length 0: the sender is shutting down on purpose
//   ABORT    payload = the sender's first error; it is broken and going away
//   NUDGE    length 0: wakes a peer sleeping in a shared-memory wait (the
//            shared-memory transport's doorbell); otherwise ignored
#pragma once
#include <cstdint>

#include "transport/transport.h"

namespace hvdlite {
namespace tcp_wire {

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the TCP wire format assumes little-endian hosts");

// "HVD" + a kind byte, so a stray byte stream is recognized as corrupt.
enum Kind : uint32_t {
  kData = 0x01445648u,
  kControl = 0x02445648u,
  kDepart = 0x03445648u,
  kAbort = 0x04445648u,
  kNudge = 0x05445648u,
};

struct FrameHeader {
  uint32_t kind;
  uint32_t tag;
  uint64_t length;
};
static_assert(sizeof(FrameHeader) == 16, "FrameHeader must be packed to 16 bytes");

using ::hvdlite::kMaxControlLen;  // transport.h: a longer CONTROL frame means a corrupt stream
constexpr uint64_t kMaxAbortLen = 64u << 10;

// Handshake (connector = higher rank, acceptor = lower rank):
//   acceptor  -> connector: kHandshakeMagic + nonce_a[32]
//   connector -> acceptor : kHandshakeMagic + u32 rank
//                           + HMAC(secret, nonce_a || rank || prefix || "conn") + nonce_c[32]
//   acceptor  -> connector: HMAC(secret, nonce_c || acceptor rank || prefix || "acc")
constexpr char kHandshakeMagic[4] = {'H', 'V', 'D', 'T'};
constexpr size_t kNonceLen = 32;
constexpr size_t kGreetingLen = 4 + kNonceLen;
constexpr size_t kHelloLen = 4 + 4 + 32 + kNonceLen;
constexpr size_t kProofLen = 32;
constexpr double kHandshakeTimeoutS = 5.0;  // per incoming connection

}  // namespace tcp_wire
}  // namespace hvdlite
