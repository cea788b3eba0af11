// UTF-8 validation of byte strings as the Unicode Standard defines well-formed UTF-8 (Unicode
// 15, section 3.9, Table 3-7 "Well-Formed UTF-8 Byte Sequences"): no overlong forms, no encoded
// surrogates (U+D800..U+DFFF), nothing above U+10FFFF, no stray or missing continuation bytes.
// This is what Python's bytes.decode("utf-8") and Arrow's string validation accept.
//
//   Code points         Byte 1  Byte 2  Byte 3  Byte 4
//   U+0000..U+007F      00..7F
//   U+0080..U+07FF      C2..DF  80..BF
//   U+0800..U+0FFF      E0      A0..BF  80..BF
//   U+1000..U+CFFF      E1..EC  80..BF  80..BF
//   U+D000..U+D7FF      ED      80..9F  80..BF
//   U+E000..U+FFFF      EE..EF  80..BF  80..BF
//   U+10000..U+3FFFF    F0      90..BF  80..BF  80..BF
//   U+40000..U+FFFFF    F1..F3  80..BF  80..BF  80..BF
//   U+100000..U+10FFFF  F4      80..8F  80..BF  80..BF
#pragma once
#include <cstddef>
#include <cstdint>

#include "statecore/detail/bytes.h"

namespace statecore {
namespace detail {

// Why a byte string is not well-formed UTF-8 (utf8_check).
enum class Utf8Error : uint8_t {
  kNone,
  kStrayContinuation,  // 80..BF where a sequence should start
  kOverlong,           // C0, C1, E0 80..9F, F0 80..8F: a shorter form exists
  kSurrogate,          // ED A0..BF: U+D800..U+DFFF
  kTooLarge,           // F4 90..BF, F5..F7: above U+10FFFF
  kInvalidByte,        // F8..FF: never in UTF-8
  kTruncated,          // the string ends inside a sequence
  kBadContinuation,    // a sequence broken off by a byte that is not 80..BF
};

// A few words on err for error messages ("overlong form", ...).
inline const char* utf8_error_name(Utf8Error err) {
  switch (err) {
    case Utf8Error::kNone: return "valid";
    case Utf8Error::kStrayContinuation: return "unexpected continuation byte";
    case Utf8Error::kOverlong: return "overlong form";
    case Utf8Error::kSurrogate: return "encoded surrogate";
    case Utf8Error::kTooLarge: return "code point above U+10FFFF";
    case Utf8Error::kInvalidByte: return "invalid byte";
    case Utf8Error::kTruncated: return "truncated sequence";
    case Utf8Error::kBadContinuation: return "missing continuation byte";
  }
  return "?";
}

// Checks p[0, n) against Table 3-7. Returns kNone, or the first error with *at (may be null) =
// the offset of the first byte of the ill-formed sequence. ASCII runs are skipped 16 bytes
// (then 8) at a time: text keys and values are mostly ASCII.
inline Utf8Error utf8_check(const uint8_t* p, size_t n, size_t* at = nullptr) {
  constexpr uint64_t kHigh = 0x8080808080808080ull;
  size_t i = 0;
  while (i < n) {
    while (i + 16 <= n && ((load_u64(p + i) | load_u64(p + i + 8)) & kHigh) == 0) i += 16;
    if (i + 8 <= n && (load_u64(p + i) & kHigh) == 0) i += 8;
    if (i == n) break;
    const size_t start = i;
    Utf8Error err = Utf8Error::kNone;
    // One sequence at p[i]. lo/hi: the range byte 2 must fall in (Table 3-7's second column).
    const uint8_t b = p[i];
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t len = 1;
    uint8_t lo = 0x80, hi = 0xBF;
    if (b < 0xC2) {
      err = b < 0xC0 ? Utf8Error::kStrayContinuation : Utf8Error::kOverlong;
    } else if (b < 0xE0) {
      len = 2;
    } else if (b < 0xF0) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      else if (b == 0xED) hi = 0x9F;
    } else if (b < 0xF5) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      else if (b == 0xF4) hi = 0x8F;
    } else {
      err = b < 0xF8 ? Utf8Error::kTooLarge : Utf8Error::kInvalidByte;
    }
    if (err == Utf8Error::kNone) {
      if (i + 1 >= n) {
        err = Utf8Error::kTruncated;
      } else if (p[i + 1] < lo || p[i + 1] > hi) {
        const uint8_t c = p[i + 1];
        if (c < 0x80 || c > 0xBF) err = Utf8Error::kBadContinuation;
        else if (b == 0xED) err = Utf8Error::kSurrogate;
        else if (b == 0xF4) err = Utf8Error::kTooLarge;
        else err = Utf8Error::kOverlong;  // E0 80..9F, F0 80..8F
      } else {
        for (size_t j = 2; j < len && err == Utf8Error::kNone; ++j) {
          if (i + j >= n) err = Utf8Error::kTruncated;
          else if ((p[i + j] & 0xC0) != 0x80) err = Utf8Error::kBadContinuation;
        }
      }
    }
    if (err != Utf8Error::kNone) {
      if (at != nullptr) *at = start;
      return err;
    }
    i += len;
  }
  return Utf8Error::kNone;
}

// Whether p[0, n) is well-formed UTF-8 (utf8_check).
inline bool utf8_valid(const uint8_t* p, size_t n) { return utf8_check(p, n) == Utf8Error::kNone; }

}  // namespace detail
}  // namespace statecore
