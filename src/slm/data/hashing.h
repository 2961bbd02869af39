#pragma once
// Checksums and hashes for the data pipeline: CRC-32C (Castagnoli) guards shard files; a fast 64-bit byte hash
// and the splitmix64 mixer serve exact deduplication, MinHash and deterministic splits/sampling.
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace slm::data {

// CRC-32C of `n` bytes, continuing from `crc` (0 to start). Software slicing-by-8, about 1-2 GB/s.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

// The splitmix64 finalizer: a bijective 64-bit mixer.
constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// A seeded 64-bit hash of bytes (not cryptographic; stable across platforms and releases: splits depend on it).
uint64_t hash64(std::string_view bytes, uint64_t seed = 0);

// A deterministic uniform double in [0, 1) from a 64-bit key.
inline double unit_interval(uint64_t key) { return static_cast<double>(mix64(key) >> 11) * 0x1.0p-53; }

}  // namespace slm::data
