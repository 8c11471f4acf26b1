#include "fsdpx/seeds.h"

namespace fsdpx {

uint64_t parameter_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the name, then splitmix64 with the seed
  for (unsigned char c : name) h = (h ^ c) * 1099511628211ULL;
  uint64_t z = h ^ (seed + 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

}  // namespace fsdpx
