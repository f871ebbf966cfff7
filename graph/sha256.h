// SHA-256 (FIPS 180-4), streaming: checkpoints of many GB are hashed chunk by
// chunk without holding them in memory. Self-contained (no OpenSSL).
//
//   Sha256 hasher;
//   while (ReadChunk(&chunk)) hasher.Update(chunk.data(), chunk.size());
//   std::string digest = hasher.FinishHex();  // 64 lowercase hex digits
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace castor {

class Sha256 {
 public:
  Sha256() { Reset(); }

  // Appends `n` bytes to the message.
  void Update(const void* data, size_t n);
  void Update(const std::string& s) { Update(s.data(), s.size()); }

  // Pads the message and returns its 32-byte digest, then resets the hasher
  // so it can hash a new message.
  std::array<uint8_t, 32> Finish();
  // Finish() as 64 lowercase hex digits.
  std::string FinishHex();

 private:
  void Reset();
  void ProcessBlock(const uint8_t* block);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_;
  size_t buffered_ = 0;        // bytes waiting in buffer_ (< 64)
  uint64_t total_bytes_ = 0;   // message length so far
};

// The SHA-256 of `data` as 64 lowercase hex digits.
std::string Sha256Hex(const std::string& data);

}  // namespace castor
