// TCP rendezvous store with HMAC-SHA256 challenge authentication.
//
// Wire protocol (all integers little-endian):
//   server -> client: "HVDS" + 32-byte random nonce
//   client -> server: 32-byte HMAC-SHA256(secret, nonce || "hvdlite-store-v1")
//   server -> client: 1 byte, 1 = admitted (a wrong proof just closes the socket)
//   then request frames  [u8 op][u32 key_len][key][u32 val_len][val]
//   and reply frames     [u8 status][u32 len][payload]
// A peer that sends a bad proof, an unknown op, an oversized length (> 64 MiB,
// or anything before authentication beyond the 32-byte proof) or that stays
// silent past the authentication timeout is disconnected; other clients are
// not affected.
#pragma once
#include <memory>
#include <string>

#include "common/status.h"
#include "rendezvous/store.h"

namespace hvdlite {

class TcpStoreServer {
 public:
  virtual ~TcpStoreServer() = default;
  // The bound port (useful when started with port 0).
  virtual int port() const = 0;
  // Stops the server thread and closes every socket. Idempotent.
  virtual void Stop() = 0;
};

// Binds host:port (port 0 = ephemeral) and serves on a background thread.
// `secret` is the raw job secret (bytes, not hex). Any number of clients is
// served; `expected_clients` (> 0: the job's size) makes it check first that
// the open-file limit holds them (raising the soft limit to the hard one if
// needed), and fail with an error naming the limit and `ulimit -n` otherwise.
Status StartTcpStoreServer(const std::string& host, int port, const std::string& secret,
                           std::unique_ptr<TcpStoreServer>* out, int expected_clients = 0);

// Connects to "host:port", authenticating with `secret` (raw bytes); retries
// until timeout_s while the server is not yet listening.
Status ConnectTcpStore(const std::string& addr, const std::string& secret, double timeout_s,
                       std::unique_ptr<Store>* out);

}  // namespace hvdlite
