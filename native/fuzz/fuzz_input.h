// What every libFuzzer target of native/fuzz/ shares: a reader that takes fields from the front
// of the fuzz input (running out of input yields zeros, so every input is a valid call), and the
// contract check, which aborts -- a finding -- naming the broken promise.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace statecore_fuzz {

// Aborts (libFuzzer records the input as a crash) when `ok` is false.
#define FUZZ_CHECK(ok, what)                                                                      \
  do {                                                                                            \
    if (!(ok)) {                                                                                  \
      std::fprintf(stderr, "contract broken at %s:%d: %s (%s)\n", __FILE__, __LINE__, what, #ok); \
      std::abort();                                                                               \
    }                                                                                             \
  } while (0)

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  uint8_t u8() {
    if (n_ == 0) return 0;
    --n_;
    return *p_++;
  }
  uint32_t le32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(u8()) << (8 * i);
    return v;
  }
  uint64_t le64() {
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(u8()) << (8 * i);
    return v;
  }
  // Up to `want` bytes (fewer at the end of the input); the pointer stays inside the input.
  const uint8_t* bytes(size_t want, size_t* got) {
    *got = want < n_ ? want : n_;
    const uint8_t* at = p_;
    p_ += *got;
    n_ -= *got;
    return at;
  }
  const uint8_t* rest(size_t* got) { return bytes(n_, got); }
  size_t left() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

}  // namespace statecore_fuzz
