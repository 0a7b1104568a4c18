// FNV-1a, 64 bits: a fingerprint of bytes, stable across hosts (values are fed as little-endian
// bytes). Not a checksum against tampering: it tells "built from other data" apart (packing plan
// keys, a dataset's fingerprint in a checkpoint).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace berth {

struct Fnv1a {
  uint64_t h = 0xcbf29ce484222325ull;
  void bytes(const void* data, size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) {
      h ^= p[i];
      h *= 0x100000001b3ull;
    }
  }
  void u64(uint64_t v) {  // little-endian bytes, whatever the host
    unsigned char b[8];
    for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(v >> (8 * i));
    bytes(b, 8);
  }
  void f64(double v) {
    uint64_t bits = 0;
    std::memcpy(&bits, &v, sizeof bits);
    u64(bits);
  }
};

}  // namespace berth
