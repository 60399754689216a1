// HMAC-SHA256 (RFC 2104), constant-time comparison and random bytes, all from OpenSSL's
// libcrypto: they prove job membership to the rendezvous store and to transport peers
// without sending the secret. No hash is written here. Thread-safe (libcrypto 1.1+ needs no
// locking set-up); none of these blocks beyond the OS random source's first seeding.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace hvdlite {

using Digest256 = std::array<uint8_t, 32>;

// HMAC-SHA256(key, message) into *out. False only when libcrypto fails (out of memory, a
// provider refusing SHA-256): callers then fail the handshake closed, never send *out.
bool HmacSha256(const std::string& key, const std::string& message, Digest256* out);
// Constant-time comparison of two digests (CRYPTO_memcmp).
bool DigestEqual(const Digest256& a, const Digest256& b);
// Fills `len` bytes from libcrypto's CSPRNG (RAND_bytes, seeded from the OS; reseeded after a
// fork). False when it cannot be seeded.
bool RandomBytes(void* out, size_t len);
// Lower-case hex <-> bytes; HexDecode returns false on malformed input.
std::string HexEncode(const void* data, size_t len);
bool HexDecode(const std::string& hex, std::string* out);

}  // namespace hvdlite
