// SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104), used to prove job membership
// to the rendezvous store and to transport peers without sending the secret.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdlite {

using Digest256 = std::array<uint8_t, 32>;

Digest256 Sha256(const void* data, size_t len);
Digest256 HmacSha256(const std::string& key, const std::string& message);
// Constant-time comparison of two digests.
bool DigestEqual(const Digest256& a, const Digest256& b);
// Fills `len` bytes from the OS random source (getrandom / /dev/urandom).
bool RandomBytes(void* out, size_t len);
// Lower-case hex <-> bytes; HexDecode returns false on malformed input.
std::string HexEncode(const void* data, size_t len);
bool HexDecode(const std::string& hex, std::string* out);

}  // namespace hvdlite
