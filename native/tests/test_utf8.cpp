// The UTF-8 validator (detail/utf8.h) against a reference that decodes code points and checks
// their ranges (a different formulation of the Unicode Standard's Table 3-7): every sequence of 1
// to 3 bytes, 4-byte sequences over every lead, second and third byte, sequences placed at every
// position of an ASCII run (the 8/16-byte fast paths), random strings, and Markus Kuhn's UTF-8
// decoder stress test cases. Then check_column_data (key_columns.h) over hand-built string
// columns: offsets, nulls, row boundaries inside a sequence.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/arrow_abi.h"
#include "statecore/detail/utf8.h"
#include "statecore/key_columns.h"

using namespace statecore;
using detail::Utf8Error;

namespace {

// Reference: decode each sequence by its lead byte's length, then reject overlong forms,
// surrogates and code points past U+10FFFF by value. Returns whether p[0, n) is valid; *at = the
// first ill-formed sequence's start.
bool ref_valid(const uint8_t* p, size_t n, size_t* at) {
  size_t i = 0;
  while (i < n) {
    const uint8_t b = p[i];
    size_t len = b < 0x80             ? 1
                 : (b & 0xE0) == 0xC0 ? 2
                 : (b & 0xF0) == 0xE0 ? 3
                 : (b & 0xF8) == 0xF0 ? 4
                                      : 0;
    bool ok = len != 0 && i + len <= n;
    uint32_t cp = len == 1 ? b : len == 2 ? b & 0x1F : len == 3 ? b & 0x0F : b & 0x07;
    for (size_t j = 1; ok && j < len; ++j) {
      if ((p[i + j] & 0xC0) != 0x80) ok = false;
      cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    static const uint32_t kMin[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (ok && (cp < kMin[len] || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF)) ok = false;
    if (!ok) {
      *at = i;
      return false;
    }
    i += len;
  }
  return true;
}

// utf8_check agrees with the reference on p[0, n): validity and where. The bytes are copied
// before a continuation byte, so that a read past the end shows as an error.
bool agrees(const uint8_t* p, size_t n) {
  std::vector<uint8_t> copy(p, p + n);
  copy.push_back(0x80);
  size_t at = 0, ref_at = 0;
  const Utf8Error err = detail::utf8_check(copy.data(), n, &at);
  const bool ref = ref_valid(p, n, &ref_at);
  if ((err == Utf8Error::kNone) != ref) return false;
  return ref || at == ref_at;
}

Utf8Error check_bytes(const std::string& s, size_t* at = nullptr) {
  return detail::utf8_check(reinterpret_cast<const uint8_t*>(s.data()), s.size(), at);
}

TEST(every_sequence_of_one_to_three_bytes) {
  long long bad = 0;
  uint8_t buf[3];
  for (int a = 0; a < 256; ++a) {
    buf[0] = static_cast<uint8_t>(a);
    bad += !agrees(buf, 1);
    for (int b = 0; b < 256; ++b) {
      buf[1] = static_cast<uint8_t>(b);
      bad += !agrees(buf, 2);
      for (int c = 0; c < 256; ++c) {
        buf[2] = static_cast<uint8_t>(c);
        bad += !agrees(buf, 3);
      }
    }
  }
  CHECK_EQ(bad, 0LL);
}

TEST(four_byte_sequences_over_every_lead_second_and_third_byte) {
  // The fourth byte only matters as continuation or not: its boundary values stand for all.
  static const uint8_t kFourth[] = {0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0xBF, 0xC0, 0xF4, 0xFF};
  long long bad = 0;
  uint8_t buf[4];
  for (int a = 0xC0; a < 256; ++a)
    for (int b = 0; b < 256; ++b)
      for (int c = 0; c < 256; ++c)
        for (uint8_t d : kFourth) {
          buf[0] = static_cast<uint8_t>(a);
          buf[1] = static_cast<uint8_t>(b);
          buf[2] = static_cast<uint8_t>(c);
          buf[3] = d;
          bad += !agrees(buf, 4);
        }
  CHECK_EQ(bad, 0LL);
}

TEST(sequences_at_every_position_of_an_ascii_run) {
  const std::vector<std::string> seqs = {"\xC3\xA9",
                                         "\xE2\x82\xAC",
                                         "\xF0\x9F\x98\x80",
                                         "\xF4\x8F\xBF\xBF",
                                         "\xC0\xAF",
                                         "\xE0\x80\xAF",
                                         "\xF0\x80\x80\xAF",
                                         "\xED\xA0\x80",
                                         "\xF4\x90\x80\x80",
                                         "\xF5\x80\x80\x80",
                                         "\x80",
                                         "\xBF",
                                         "\xE2\x82",
                                         "\xF0\x9F\x98",
                                         "\xC3",
                                         "\xFF"};
  long long bad = 0;
  for (size_t len = 0; len <= 40; ++len) {
    const std::string ascii(len, 'a');
    bad += !agrees(reinterpret_cast<const uint8_t*>(ascii.data()), len);
  }
  for (const std::string& s : seqs) {
    for (size_t pos = 0; pos <= 40; ++pos) {
      for (size_t tail : {size_t(0), size_t(1), size_t(9), size_t(23)}) {
        const std::string str = std::string(pos, 'a') + s + std::string(tail, 'b');
        bad += !agrees(reinterpret_cast<const uint8_t*>(str.data()), str.size());
      }
    }
  }
  CHECK_EQ(bad, 0LL);
}

TEST(random_strings) {
  std::mt19937_64 rng(7);
  // Mostly valid text of 1-4 byte characters with a byte now and then replaced at random.
  const std::vector<std::string> chars = {"a",
                                          "Z",
                                          " ",
                                          "\xC3\xA9",
                                          "\xE2\x82\xAC",
                                          "\xEF\xBF\xBF",
                                          "\xF0\x9F\x98\x80",
                                          "\xF4\x8F\xBF\xBF"};
  long long bad = 0, invalid = 0;
  for (int t = 0; t < 200000; ++t) {
    std::string s;
    const size_t len = rng() % 40;
    while (s.size() < len) s += chars[rng() % chars.size()];
    if (!s.empty() && rng() % 2) s[rng() % s.size()] = static_cast<char>(rng() & 0xFF);
    bad += !agrees(reinterpret_cast<const uint8_t*>(s.data()), s.size());
    invalid += check_bytes(s) != Utf8Error::kNone;
  }
  CHECK_EQ(bad, 0LL);
  CHECK(invalid > 10000);  // the corrupted strings do exercise the error paths
}

// Markus Kuhn, "UTF-8 decoder capability and stress test" (sections 2-5), each with the error
// and position the validator reports.
TEST(markus_kuhn_stress_cases) {
  struct Case {
    const char* bytes;
    size_t size;
    Utf8Error err;
    size_t at;
  };
  const Case cases[] = {
      // 2.1-2.3: boundaries, all valid
      {"\x00", 1, Utf8Error::kNone, 0},
      {"\xC2\x80", 2, Utf8Error::kNone, 0},
      {"\xE0\xA0\x80", 3, Utf8Error::kNone, 0},
      {"\xF0\x90\x80\x80", 4, Utf8Error::kNone, 0},
      {"\x7F", 1, Utf8Error::kNone, 0},
      {"\xDF\xBF", 2, Utf8Error::kNone, 0},
      {"\xEF\xBF\xBF", 3, Utf8Error::kNone, 0},
      {"\xED\x9F\xBF", 3, Utf8Error::kNone, 0},
      {"\xEE\x80\x80", 3, Utf8Error::kNone, 0},
      {"\xEF\xBF\xBD", 3, Utf8Error::kNone, 0},
      {"\xF4\x8F\xBF\xBF", 4, Utf8Error::kNone, 0},
      // 2.2: 5- and 6-byte forms and past U+10FFFF
      {"\xF4\x90\x80\x80", 4, Utf8Error::kTooLarge, 0},
      {"\xF7\xBF\xBF\xBF", 4, Utf8Error::kTooLarge, 0},
      {"\xF8\x88\x80\x80\x80", 5, Utf8Error::kInvalidByte, 0},
      {"\xFC\x84\x80\x80\x80\x80", 6, Utf8Error::kInvalidByte, 0},
      // 3.1: unexpected continuation bytes
      {"\x80", 1, Utf8Error::kStrayContinuation, 0},
      {"\xBF", 1, Utf8Error::kStrayContinuation, 0},
      {"a\x80\xBF", 3, Utf8Error::kStrayContinuation, 1},
      // 3.2: lonely start characters
      {"\xC0 ", 2, Utf8Error::kOverlong, 0},
      {"\xC2 ", 2, Utf8Error::kBadContinuation, 0},
      {"\xE0 ", 2, Utf8Error::kBadContinuation, 0},
      {"\xF0 ", 2, Utf8Error::kBadContinuation, 0},
      // 3.3: sequences with the last continuation byte missing
      {"\xC2", 1, Utf8Error::kTruncated, 0},
      {"\xE0\xA0", 2, Utf8Error::kTruncated, 0},
      {"\xF0\x90\x80", 3, Utf8Error::kTruncated, 0},
      {"\xDF", 1, Utf8Error::kTruncated, 0},
      {"\xEF\xBF", 2, Utf8Error::kTruncated, 0},
      {"\xF4\x8F\xBF", 3, Utf8Error::kTruncated, 0},
      {"ab\xE2\x82", 4, Utf8Error::kTruncated, 2},
      // 3.5: impossible bytes
      {"\xFE", 1, Utf8Error::kInvalidByte, 0},
      {"\xFF", 1, Utf8Error::kInvalidByte, 0},
      {"\xFE\xFE\xFF\xFF", 4, Utf8Error::kInvalidByte, 0},
      // 4.1-4.3: overlong forms (ASCII '/', the maximum overlong of each length, NUL)
      {"\xC0\xAF", 2, Utf8Error::kOverlong, 0},
      {"\xE0\x80\xAF", 3, Utf8Error::kOverlong, 0},
      {"\xF0\x80\x80\xAF", 4, Utf8Error::kOverlong, 0},
      {"\xC1\xBF", 2, Utf8Error::kOverlong, 0},
      {"\xE0\x9F\xBF", 3, Utf8Error::kOverlong, 0},
      {"\xF0\x8F\xBF\xBF", 4, Utf8Error::kOverlong, 0},
      {"\xC0\x80", 2, Utf8Error::kOverlong, 0},
      {"\xE0\x80\x80", 3, Utf8Error::kOverlong, 0},
      {"\xF0\x80\x80\x80", 4, Utf8Error::kOverlong, 0},
      // 5.1-5.2: single and paired UTF-16 surrogates
      {"\xED\xA0\x80", 3, Utf8Error::kSurrogate, 0},
      {"\xED\xAD\xBF", 3, Utf8Error::kSurrogate, 0},
      {"\xED\xBF\xBF", 3, Utf8Error::kSurrogate, 0},
      {"\xED\xA0\x80\xED\xB0\x80", 6, Utf8Error::kSurrogate, 0},
      // 5.3: noncharacters are well-formed
      {"\xEF\xBF\xBE", 3, Utf8Error::kNone, 0},
      {"\xF4\x8F\xBF\xBE", 4, Utf8Error::kNone, 0},
      // a sequence broken off by ASCII
      {"\xE2\x82"
       "a",
       3, Utf8Error::kBadContinuation, 0},
      {"\xF0\x9F\x98"
       "a",
       4, Utf8Error::kBadContinuation, 0},
  };
  for (const Case& c : cases) {
    size_t at = 99;
    const Utf8Error err =
        detail::utf8_check(reinterpret_cast<const uint8_t*>(c.bytes), c.size, &at);
    CHECK_EQ(static_cast<int>(err), static_cast<int>(c.err));
    if (c.err != Utf8Error::kNone) CHECK_EQ(at, c.at);
    CHECK(agrees(reinterpret_cast<const uint8_t*>(c.bytes), c.size));
  }
}

// ---- check_column_data over hand-built Arrow string columns

void release_schema(ArrowSchema* s) { s->release = nullptr; }
void release_array(ArrowArray* a) { a->release = nullptr; }

// A utf8 (or binary, format "z") column with int32 offsets over `data`; `validity` null for none.
struct Column {
  std::vector<int32_t> offsets;
  std::string data;
  std::vector<uint8_t> validity;
  const void* buffers[3] = {};
  ArrowSchema schema{};
  ArrowArray array{};

  Column(std::vector<int32_t> offs, std::string bytes, const char* format = "u",
         std::vector<uint8_t> valid = {}, int64_t offset = 0, int64_t length = -1)
      : offsets(std::move(offs)), data(std::move(bytes)), validity(std::move(valid)) {
    buffers[0] = validity.empty() ? nullptr : validity.data();
    buffers[1] = offsets.data();
    buffers[2] = data.data();
    schema.format = format;
    schema.release = release_schema;
    array.length = length >= 0 ? length : static_cast<int64_t>(offsets.size()) - 1 - offset;
    array.offset = offset;
    array.null_count = validity.empty() ? 0 : -1;
    array.n_buffers = 3;
    array.buffers = buffers;
    array.release = release_array;
  }
  int64_t check(std::string* why) const {
    return check_column_data(ArrayView(&schema, &array), why);
  }
};

TEST(check_column_data_accepts_valid_columns) {
  std::string why;
  CHECK_EQ(Column({0, 1, 3, 3, 7}, "a\xC3\xA9\xF0\x9F\x98\x80").check(&why), -1);
  CHECK_EQ(Column({0}, "").check(&why), -1);
  CHECK_EQ(Column({0, 0, 0}, "").check(&why), -1);
  // Binary columns take any bytes.
  CHECK_EQ(Column({0, 2}, "\xFF\xFE", "z").check(&why), -1);
}

TEST(check_column_data_names_the_bad_row_and_why) {
  std::string why;
  CHECK_EQ(Column({0, 1, 3}, "a\xC0\xAF").check(&why), 1);
  CHECK(why.find("invalid UTF-8 at byte 0 (overlong form)") != std::string::npos);
  CHECK_EQ(Column({0, 2, 5}, "ab\xED\xA0\x80").check(&why), 1);
  CHECK(why.find("encoded surrogate") != std::string::npos);
  CHECK_EQ(Column({0, 1, 5}, "a\xF4\x90\x80\x80").check(&why), 1);
  CHECK(why.find("above U+10FFFF") != std::string::npos);
  CHECK_EQ(Column({0, 1, 2}, "ab\xE2\x82").check(&why), -1);  // bytes past the last offset unread
  CHECK_EQ(Column({0, 1, 3}, "a\xE2\x82").check(&why), 1);
  CHECK(why.find("truncated") != std::string::npos);
  CHECK_EQ(Column({0, 1, 2}, "a\x80").check(&why), 1);
  CHECK(why.find("unexpected continuation byte") != std::string::npos);
}

TEST(check_column_data_checks_each_row_not_their_concatenation) {
  std::string why;
  // "é" split over two rows: the bytes together are valid, neither row is.
  CHECK_EQ(Column({0, 1, 2}, "\xC3\xA9").check(&why), 0);
  CHECK(why.find("truncated") != std::string::npos);
  CHECK_EQ(Column({0, 2, 3, 4}, "ab\xC3\xA9").check(&why), 1);
  // A row boundary at a continuation byte, the earlier row null: the later row is still bad.
  CHECK_EQ(Column({0, 1, 2}, "\xC3\xA9", "u", {0x02}).check(&why), 1);
  CHECK(why.find("unexpected continuation byte") != std::string::npos);
}

TEST(check_column_data_skips_the_bytes_of_null_rows_but_not_their_offsets) {
  std::string why;
  // Row 1 is null: its bytes are not UTF-8 and need not be (as in pyarrow's validation).
  CHECK_EQ(Column({0, 1, 3, 4},
                  "a\xFF\xFE"
                  "b",
                  "u", {0x05})
               .check(&why),
           -1);
  CHECK_EQ(Column({0, 1, 3, 4},
                  "a\xFF\xFE"
                  "b",
                  "u", {0x07})
               .check(&why),
           1);
  // A null row's offsets going backwards are bad all the same.
  CHECK_EQ(Column({0, 3, 1, 4}, "abcd", "u", {0x05}).check(&why), 1);
  CHECK(why.find("offsets go backwards (end 1 < start 3)") != std::string::npos);
}

TEST(check_column_data_checks_offsets) {
  std::string why;
  CHECK_EQ(Column({0, 2, 1, 3}, "abcd").check(&why), 1);
  CHECK(why.find("offsets go backwards (end 1 < start 2)") != std::string::npos);
  // An end past the last offset is found where it is, before any byte there is read.
  CHECK_EQ(Column({0, 3, 1}, "abcd").check(&why), 0);
  CHECK(why.find("offset 3 past the array's last offset 1") != std::string::npos);
  CHECK_EQ(Column({0, 9, 4}, "abcd", "z").check(&why), 0);
  CHECK(why.find("past the array's last offset 4") != std::string::npos);
  CHECK_EQ(Column({-1, 2}, "ab").check(&why), 0);
  CHECK(why.find("negative offset -1") != std::string::npos);
  // Only the viewed rows count: a slice past a bad offset is fine.
  CHECK_EQ(Column({5, 0, 1, 2}, "ab", "u", {}, 1, 2).check(&why), -1);
  CHECK_EQ(Column({0, 1, 0, 2}, "ab", "u", {}, 1, 2).check(&why), 0);
  // No values buffer while a row references bytes.
  Column none({0, 0, 2}, "ab");
  none.buffers[2] = nullptr;
  CHECK_EQ(none.check(&why), 1);
  CHECK(why.find("no values buffer") != std::string::npos);
  Column empty({0, 0, 0}, "");
  empty.buffers[2] = nullptr;
  CHECK_EQ(empty.check(&why), -1);
}

}  // namespace

TEST_MAIN()
