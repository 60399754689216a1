// Store: the rendezvous key-value service ranks use to find each other.
//
// Implementations: TcpStoreClient (talks to a TcpStoreServer hosted by
// hvdliterun or a test), MemoryStore (one process, for size-1 jobs and tests).
// Every call is blocking and bounded: Get() waits for the key at most
// `timeout_s` seconds, the others for the store's I/O timeout.
// Thread-safety: one Store object may be used from several threads.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace hvdlite {

class Store {
 public:
  virtual ~Store() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` exists, at most timeout_s; Timeout status names the key.
  virtual Status Get(const std::string& key, double timeout_s, std::string* value) = 0;
  // Atomically adds `delta` to the integer at `key` (missing = 0); returns the new value.
  virtual Status Add(const std::string& key, int64_t delta, int64_t* result) = 0;
};

std::unique_ptr<Store> NewMemoryStore();

}  // namespace hvdlite
