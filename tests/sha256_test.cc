// SHA-256 against the FIPS 180-2 / NIST example vectors, padding boundaries,
// and streaming in odd-sized chunks.
#include "graph/sha256.h"

#include <algorithm>
#include <string>

#include "gtest/gtest.h"

namespace castor {
namespace {

TEST(Sha256Test, NistVectors) {
  EXPECT_EQ(Sha256Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(Sha256Hex("abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmno"
                      "ijklmnopjklmnopqklmnopqrlmnopqrsmnopqrstnopqrstu"),
            "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1");
}

TEST(Sha256Test, OneMillionA) {
  EXPECT_EQ(Sha256Hex(std::string(1000000, 'a')),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

// Lengths around the 55/56-byte padding boundary and whole blocks
// (expected values from Python's hashlib).
TEST(Sha256Test, PaddingBoundaries) {
  EXPECT_EQ(Sha256Hex(std::string(55, 'a')),
            "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  EXPECT_EQ(Sha256Hex(std::string(56, 'a')),
            "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  EXPECT_EQ(Sha256Hex(std::string(63, 'a')),
            "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34");
  EXPECT_EQ(Sha256Hex(std::string(64, 'a')),
            "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
  EXPECT_EQ(Sha256Hex(std::string(119, 'a')),
            "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb");
  EXPECT_EQ(Sha256Hex(std::string(120, 'a')),
            "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c");
}

TEST(Sha256Test, StreamingInOddChunksMatchesOneShot) {
  std::string message;
  for (int i = 0; i < 10007; ++i) message.push_back(static_cast<char>((i * 131 + 7) & 0xff));
  const std::string one_shot = Sha256Hex(message);
  for (size_t chunk : {size_t{1}, size_t{3}, size_t{7}, size_t{63}, size_t{64}, size_t{65},
                       size_t{1000}}) {
    Sha256 hasher;
    for (size_t offset = 0; offset < message.size(); offset += chunk) {
      hasher.Update(message.data() + offset, std::min(chunk, message.size() - offset));
    }
    EXPECT_EQ(hasher.FinishHex(), one_shot) << "chunk size " << chunk;
  }
  // Mixed chunk sizes, including empty updates.
  Sha256 hasher;
  size_t offset = 0;
  const size_t sizes[] = {0, 5, 59, 0, 130, 1, 64, 17};
  for (int i = 0; offset < message.size(); ++i) {
    const size_t take = std::min(sizes[i % 8], message.size() - offset);
    hasher.Update(message.data() + offset, take);
    offset += take;
  }
  EXPECT_EQ(hasher.FinishHex(), one_shot);
}

TEST(Sha256Test, FinishResetsForTheNextMessage) {
  Sha256 hasher;
  hasher.Update(std::string("ab"));
  hasher.Update(std::string("c"));
  const std::array<uint8_t, 32> digest = hasher.Finish();
  EXPECT_EQ(digest[0], 0xba);
  EXPECT_EQ(digest[31], 0xad);
  EXPECT_EQ(hasher.FinishHex(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

}  // namespace
}  // namespace castor
