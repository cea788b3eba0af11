// Arrow C Data Interface arrays built by hand for the batch-kernel tests (test_batch*.cpp):
// fixed-width and variable-width arrays with validity bitmaps and a leading pad (so that every
// kernel sees a sliced array, offset != 0), a whole-table dump, and a BatchError expectation.
#pragma once
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/arrow_abi.h"
#include "statecore/batch.h"
#include "statecore/state_table.h"

namespace statecore_test {

using namespace statecore;

inline void release_schema(ArrowSchema* s) { s->release = nullptr; }
inline void release_array(ArrowArray* a) { a->release = nullptr; }

// An Arrow array owned by the test. `pad` leading elements (junk values, marked null) are placed
// before the logical start and array.offset = pad, so every kernel sees a sliced array.
struct TestArray {
  std::string format;
  std::vector<uint8_t> validity, data, values;
  const void* buffers[3] = {nullptr, nullptr, nullptr};
  ArrowSchema schema{};
  ArrowArray array{};

  ArrowInput in() const { return ArrowInput{&schema, &array}; }

  void finish(int64_t length, int64_t offset, int64_t n_buffers, bool any_null) {
    buffers[0] = any_null ? validity.data() : nullptr;
    buffers[1] = data.data();
    buffers[2] = values.data();
    schema.format = format.c_str();
    schema.name = "";
    schema.flags = ARROW_FLAG_NULLABLE;
    schema.release = &release_schema;
    array.length = length;
    array.offset = offset;
    array.null_count = any_null ? -1 : 0;  // -1: "unknown", the kernels must count themselves
    array.n_buffers = n_buffers;
    array.buffers = buffers;
    array.release = &release_array;
  }
  void set_valid(int64_t j, bool v) {
    if (validity.size() <= static_cast<size_t>(j / 8)) validity.resize(j / 8 + 1, 0);
    if (v) validity[j / 8] |= static_cast<uint8_t>(1u << (j % 8));
    else validity[j / 8] &= static_cast<uint8_t>(~(1u << (j % 8)));
  }
};

template <class T>
TestArray fixed(const char* format, const std::vector<std::optional<T>>& xs, int64_t pad = 0) {
  TestArray a;
  a.format = format;
  bool any_null = pad > 0;
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  a.data.resize(static_cast<size_t>(total) * sizeof(T) + 1);
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    T v = valid ? *xs[j - pad] : static_cast<T>(0x5A5A5A5A);  // junk under nulls / padding
    std::memcpy(a.data.data() + j * sizeof(T), &v, sizeof(T));
    a.set_valid(j, valid);
    any_null = any_null || !valid;
  }
  a.finish(static_cast<int64_t>(xs.size()), pad, 2, any_null);
  return a;
}

template <class Off>
TestArray varwidth(const char* format, const std::vector<std::optional<std::string>>& xs,
                   int64_t pad = 0) {
  TestArray a;
  a.format = format;
  bool any_null = pad > 0;
  const int64_t total = pad + static_cast<int64_t>(xs.size());
  std::vector<Off> offs(1, 0);
  for (int64_t j = 0; j < total; ++j) {
    const bool valid = j >= pad && xs[j - pad].has_value();
    const std::string s = valid ? *xs[j - pad] : std::string(j < pad ? "pad" : "");
    a.values.insert(a.values.end(), s.begin(), s.end());
    offs.push_back(static_cast<Off>(a.values.size()));
    a.set_valid(j, valid);
    any_null = any_null || !valid;
  }
  a.values.push_back(0);  // never empty, so the buffer pointer is non-null
  a.data.resize(offs.size() * sizeof(Off));
  std::memcpy(a.data.data(), offs.data(), a.data.size());
  a.finish(static_cast<int64_t>(xs.size()), pad, 3, any_null);
  return a;
}

using I64 = std::vector<std::optional<int64_t>>;
using F64 = std::vector<std::optional<double>>;
using Str = std::vector<std::optional<std::string>>;

// Whole table contents: encoded key -> value bytes.
inline std::map<std::string, std::string> dump(StateTable& t) {
  std::map<std::string, std::string> out;
  for (int32_t kg = t.kg_start(); kg <= t.kg_end(); ++kg) {
    t.map(kg).for_each([&](ByteView k, ByteView v) {
      out[std::string(reinterpret_cast<const char*>(k.data), k.size)] =
          std::string(reinterpret_cast<const char*>(v.data), v.size);
    });
  }
  return out;
}

// add_batch Sum's outputs for `keys` / `vals` (null values allowed) against `model`, which the
// rows then update: a value row outputs its key's running sum, a null row the current sum
// (valid only when the key has one).
template <class K>
void check_running_sums(std::map<K, int64_t>& model, const std::vector<std::optional<K>>& keys,
                        const I64& vals, const int64_t* out, const uint8_t* valid) {
  for (size_t r = 0; r < keys.size(); ++r) {
    auto it = model.find(*keys[r]);
    if (vals[r]) {
      const int64_t acc = (it == model.end() ? 0 : it->second) + *vals[r];
      model[*keys[r]] = acc;
      CHECK_EQ(int(valid[r]), 1);
      CHECK_EQ(out[r], acc);
    } else {
      CHECK_EQ(int(valid[r]), it == model.end() ? 0 : 1);
      if (it != model.end()) CHECK_EQ(out[r], it->second);
    }
  }
}

// get_batch_fixed of `q` (the model's keys, in the model's order) reads back every int64 value
// of `model`.
template <class K>
void check_reads_back(StateTable& t, const BatchKeySpec& sp, TestArray& q,
                      const std::map<K, int64_t>& model) {
  std::vector<int64_t> out(model.size());
  std::vector<uint8_t> valid(model.size());
  get_batch_fixed(t, sp, q.in(), ValueType::Int64, out.data(), valid.data());
  size_t i = 0;
  for (const auto& kv : model) {
    CHECK_EQ(int(valid[i]), 1);
    CHECK_EQ(out[i], kv.second);
    ++i;
  }
}

// Runs fn, expecting a BatchError whose message contains `needle`.
inline bool batch_error(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
  } catch (const BatchError& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return true;
    std::fprintf(stderr, "  BatchError without '%s': %s\n", needle.c_str(), e.what());
    return false;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "  unexpected exception: %s\n", e.what());
    return false;
  }
  std::fprintf(stderr, "  no exception (wanted '%s')\n", needle.c_str());
  return false;
}

// Collection blobs (batch_collections.h): every stored value, bytes helpers, an int64-key spec.
inline std::multiset<std::string> blobs(StateTable& t) {
  std::multiset<std::string> out;
  for (const auto& kv : dump(t)) out.insert(kv.second);
  return out;
}

// List entries (docs/formats.md "List state": `prefix | seq` -> element bytes): per list (the
// entries sharing a prefix, in key order) its element bytes concatenated, with "#" + its
// sequence numbers ("0,1,2") appended; so {"<e0><e1>#0,1"} is one list of two elements.
inline std::multiset<std::string> lists(StateTable& t) {
  std::map<std::string, std::string> per;
  std::map<std::string, std::string> seqs;
  for (const auto& kv : dump(t)) {
    const std::string prefix = kv.first.substr(0, kv.first.size() - 8);
    uint64_t seq = 0;
    for (size_t i = kv.first.size() - 8; i < kv.first.size(); ++i)
      seq = (seq << 8) | static_cast<uint8_t>(kv.first[i]);
    per[prefix] += kv.second;
    seqs[prefix] += (seqs[prefix].empty() ? "" : ",") + std::to_string(seq);
  }
  std::multiset<std::string> out;
  for (const auto& kv : per) out.insert(kv.second + "#" + seqs[kv.first]);
  return out;
}

inline std::string le64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
  return s;
}
inline std::string be64(int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[7 - i] = static_cast<char>(static_cast<uint64_t>(v) >> (8 * i));
  return s;
}
inline std::string byte(int b) { return std::string(1, static_cast<char>(b)); }

inline BatchKeySpec int64_spec() {
  BatchKeySpec s;
  s.key = KeySchema::scalar(KeyType::Int64);
  return s;
}

// A one-column key of type `t` over the whole key-group range [0, maxp), Spark's assigner.
inline BatchKeySpec full_range_spec(KeyType t, int32_t maxp) {
  BatchKeySpec s;
  s.key = KeySchema::scalar(t);
  s.assigner = Assigner::Spark;
  s.max_parallelism = maxp;
  s.kg_start = 0;
  s.kg_end = maxp - 1;
  return s;
}

}  // namespace statecore_test
