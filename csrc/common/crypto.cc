// The job-secret proofs' primitives on OpenSSL's libcrypto (csrc/common/crypto.h).
#include "common/crypto.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <climits>

namespace hvdlite {

bool HmacSha256(const std::string& key, const std::string& message, Digest256* out) {
  if (key.size() > size_t(INT_MAX)) return false;
  unsigned int len = 0;
  const unsigned char* md =
      HMAC(EVP_sha256(), key.data(), int(key.size()), reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), out->data(), &len);
  return md != nullptr && len == out->size();
}

bool DigestEqual(const Digest256& a, const Digest256& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

bool RandomBytes(void* out, size_t len) {
  auto* p = static_cast<unsigned char*>(out);
  while (len > 0) {  // RAND_bytes takes an int length
    const int n = len > size_t(INT_MAX) ? INT_MAX : int(len);
    if (RAND_bytes(p, n) != 1) return false;
    p += n;
    len -= size_t(n);
  }
  return true;
}

std::string HexEncode(const void* data, size_t len) {
  static const char kDigits[] = "0123456789abcdef";
  const uint8_t* p = static_cast<const uint8_t*>(data);
  std::string out(2 * len, '0');
  for (size_t i = 0; i < len; ++i) {
    out[2 * i] = kDigits[p[i] >> 4];
    out[2 * i + 1] = kDigits[p[i] & 0xf];
  }
  return out;
}

static int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

bool HexDecode(const std::string& hex, std::string* out) {
  if (hex.size() % 2 != 0) return false;
  std::string bytes(hex.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    int hi = HexValue(hex[2 * i]), lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes[i] = char((hi << 4) | lo);
  }
  *out = std::move(bytes);
  return true;
}

}  // namespace hvdlite
