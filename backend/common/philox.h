// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11; the generator of Random123, cuRAND and PyTorch's CUDA RNG) and
// Dropout's keep decision built on it. A counter-based generator: the random
// words are a pure function of (key, counter), so any element's draw is
// computed on its own, by any thread, on either backend, with the same bits.
// Header-only and CASTOR_HOST_DEVICE: the CPU and CUDA Dropout kernels call
// exactly this code.
//
// Dropout's draw for element i of a node in one run of the graph:
//   key     = the 64-bit key DropoutKey(run seed, node stream) (two words)
//   counter = (lo(i / 4), hi(i / 4), lo(call), hi(call))
//   word    = Philox4x32_10(counter, key)[i % 4]
//   keep    = word >= DropoutThreshold(ratio)      (P(keep) = 1 - ratio)
// The run seed and call counter come from the node's RNG-state input (the
// training graph's castor.rng, see passes/training_graph.h); the node
// stream is FNV-1a of the node's name, so two Dropouts of one graph draw
// different masks. (A Dropout without that input, outside training graphs,
// draws as ONNX's numpy reference does: backend/cpu/misc.cc.)
#pragma once

#include <cstdint>
#include <string_view>

#include "graph/half.h"  // CASTOR_HOST_DEVICE

namespace castor::common {

struct PhiloxWords {
  uint32_t v[4];
};

// The high and low 32 bits of a * b.
CASTOR_HOST_DEVICE inline void MulHiLo32(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(product >> 32);
  *lo = static_cast<uint32_t>(product);
}

// Ten rounds of Philox4x32 on `counter` with the two-word `key`.
CASTOR_HOST_DEVICE inline PhiloxWords Philox4x32_10(PhiloxWords counter, uint32_t key0,
                                                    uint32_t key1) {
  constexpr uint32_t kMultiplier0 = 0xD2511F53u, kMultiplier1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    MulHiLo32(kMultiplier0, counter.v[0], &hi0, &lo0);
    MulHiLo32(kMultiplier1, counter.v[2], &hi1, &lo1);
    counter = PhiloxWords{{hi1 ^ counter.v[1] ^ key0, lo1, hi0 ^ counter.v[3] ^ key1, lo0}};
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
  return counter;
}

// SplitMix64's finaliser: a bijective mix of 64 bits.
CASTOR_HOST_DEVICE inline uint64_t Mix64(uint64_t x) {
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The Philox key of one node's draws in a run seeded `run_seed`.
CASTOR_HOST_DEVICE inline uint64_t DropoutKey(uint64_t run_seed, uint64_t node_stream) {
  return Mix64(run_seed ^ Mix64(node_stream));
}

// A node's stream: FNV-1a (64-bit) of its name (host only).
inline uint64_t DropoutNodeStream(std::string_view node_name) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (const char c : node_name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001B3ull;
  }
  return hash;
}

// Words below it drop their element: floor(ratio * 2^32), exact for a
// float ratio in [0, 1), so P(word >= threshold) = 1 - ratio up to 2^-32.
CASTOR_HOST_DEVICE inline uint32_t DropoutThreshold(float ratio) {
  const double scaled = static_cast<double>(ratio) * 4294967296.0;
  if (!(scaled > 0.0)) return 0;
  if (scaled >= 4294967295.0) return 0xFFFFFFFFu;
  return static_cast<uint32_t>(scaled);
}

// The random words of elements 4 * group to 4 * group + 3 of the draw
// (`key`, `call`), in order.
CASTOR_HOST_DEVICE inline PhiloxWords DropoutGroupWords(uint64_t key, uint64_t call,
                                                        uint64_t group) {
  const PhiloxWords counter{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
                             static_cast<uint32_t>(call), static_cast<uint32_t>(call >> 32)}};
  return Philox4x32_10(counter, static_cast<uint32_t>(key), static_cast<uint32_t>(key >> 32));
}

// The random word of element `index` of the draw (`key`, `call`).
CASTOR_HOST_DEVICE inline uint32_t DropoutWord(uint64_t key, uint64_t call, uint64_t index) {
  return DropoutGroupWords(key, call, index >> 2).v[index & 3];
}

// Whether Dropout keeps element `index`.
CASTOR_HOST_DEVICE inline bool DropoutKeeps(uint64_t key, uint64_t call, uint64_t index,
                                            uint32_t threshold) {
  return DropoutWord(key, call, index) >= threshold;
}

}  // namespace castor::common
