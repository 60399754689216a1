// Private helpers shared by the Store implementations and the TCP store wire
// protocol (see tcp_store.h for the protocol itself).
#pragma once
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <sstream>
#include <string>

#include "common/status.h"

namespace hvdlite {

// Add() counters are stored as decimal strings; missing = 0.
inline bool ParseStoreCounter(const std::string& text, int64_t* out) {
  if (text.empty()) {
    *out = 0;
    return true;
  }
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return false;
  *out = static_cast<int64_t>(v);
  return true;
}

inline Status StoreGetTimeout(const std::string& key, double timeout_s) {
  std::ostringstream os;
  os << "timed out after " << timeout_s << "s waiting for rendezvous store key '" << key
     << "' (did every rank start, and with the same job id?)";
  return Status::Timeout(os.str());
}

namespace store_wire {

constexpr char kServerMagic[4] = {'H', 'V', 'D', 'S'};
constexpr size_t kNonceLen = 32;
constexpr size_t kProofLen = 32;
constexpr char kProofContext[] = "hvdlite-store-v1";
constexpr uint8_t kAdmitted = 1;
constexpr uint32_t kMaxLen = 64u << 20;  // longest key or value accepted (64 MiB)
constexpr double kAuthTimeoutS = 5.0;    // a connection must prove the secret this fast

// Request ops. Add carries the delta as an 8-byte little-endian int64 value.
enum Op : uint8_t { kSet = 1, kGet = 2, kAdd = 3 };
// Reply status byte. kAdd's payload is the new value as an 8-byte LE int64;
// kBadRequest's payload is an error message.
enum Reply : uint8_t { kOk = 0, kNotFound = 1, kBadRequest = 2 };

inline void PutU32(std::string* out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(char((v >> (8 * i)) & 0xff));
}
inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= uint32_t(uint8_t(p[i])) << (8 * i);
  return v;
}
inline void PutI64(std::string* out, int64_t v) {
  uint64_t u = static_cast<uint64_t>(v);
  for (int i = 0; i < 8; ++i) out->push_back(char((u >> (8 * i)) & 0xff));
}
inline int64_t GetI64(const char* p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; ++i) u |= uint64_t(uint8_t(p[i])) << (8 * i);
  return static_cast<int64_t>(u);
}

}  // namespace store_wire
}  // namespace hvdlite
