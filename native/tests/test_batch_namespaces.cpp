// Namespaced batch keys (batch.h BatchKeySpec::has_namespace): the kernels address
// prefix | ser(key) [| lenbytes] | ser(namespace) [| lenbytes] -- the same bytes KeyEncoder writes
// per record -- with the key group from the key alone; the same key under two namespaces is two
// entries; a null namespace or a malformed {key, namespace} struct is a BatchError raised before
// any mutation. Every kernel goes through RowKeys, so value put/get/add and list append stand for
// the rest.
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "check.h"
#include "statecore/arrow_abi.h"
#include "statecore/batch.h"
#include "statecore/batch_collections.h"
#include "statecore/key_codec.h"
#include "statecore/key_groups.h"
#include "statecore/state_table.h"

using namespace statecore;

namespace {

void noop_schema(ArrowSchema* s) { s->release = nullptr; }
void noop_array(ArrowArray* a) { a->release = nullptr; }

// An owned Arrow array: int64 ("l"), utf8 ("u", int32 offsets) or struct ("+s") of others.
// Nulls are rows whose optional is empty (a validity bitmap is then present).
struct Col {
  std::string format;
  std::vector<uint8_t> bits, fixed;
  std::vector<int32_t> offsets;
  std::string chars;
  std::vector<std::shared_ptr<Col>> kids;
  std::vector<ArrowSchema*> kid_schemas;
  std::vector<ArrowArray*> kid_arrays;
  const void* buffers[3] = {nullptr, nullptr, nullptr};
  ArrowSchema schema{};
  ArrowArray array{};

  ArrowInput in() const { return ArrowInput{&schema, &array}; }

  void seal(int64_t n, int64_t offset, int64_t n_buffers, int64_t nulls) {
    schema.format = format.c_str();
    schema.name = "";
    schema.flags = ARROW_FLAG_NULLABLE;
    schema.release = &noop_schema;
    array.length = n;
    array.offset = offset;
    array.null_count = nulls;
    array.n_buffers = n_buffers;
    array.buffers = buffers;
    array.release = &noop_array;
    if (!kids.empty()) {
      for (auto& k : kids) {
        kid_schemas.push_back(&k->schema);
        kid_arrays.push_back(&k->array);
      }
      schema.n_children = array.n_children = static_cast<int64_t>(kids.size());
      schema.children = kid_schemas.data();
      array.children = kid_arrays.data();
    }
  }
  void validity(const std::vector<bool>& valid) {
    bits.assign(valid.size() / 8 + 1, 0);
    for (size_t i = 0; i < valid.size(); ++i)
      if (valid[i]) bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
  }
};

std::shared_ptr<Col> i64(const std::vector<std::optional<int64_t>>& xs) {
  auto c = std::make_shared<Col>();
  c->format = "l";
  c->fixed.resize(xs.size() * 8 + 8);
  std::vector<bool> valid;
  int64_t nulls = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const int64_t v = xs[i].value_or(0);
    std::memcpy(c->fixed.data() + i * 8, &v, 8);
    valid.push_back(xs[i].has_value());
    nulls += !xs[i].has_value();
  }
  c->validity(valid);
  c->buffers[0] = nulls ? c->bits.data() : nullptr;
  c->buffers[1] = c->fixed.data();
  c->seal(static_cast<int64_t>(xs.size()), 0, 2, nulls);
  return c;
}

std::shared_ptr<Col> utf8(const std::vector<std::optional<std::string>>& xs) {
  auto c = std::make_shared<Col>();
  c->format = "u";
  c->offsets.push_back(0);
  std::vector<bool> valid;
  int64_t nulls = 0;
  for (const auto& x : xs) {
    c->chars += x.value_or("");
    c->offsets.push_back(static_cast<int32_t>(c->chars.size()));
    valid.push_back(x.has_value());
    nulls += !x.has_value();
  }
  c->chars.push_back('\0');
  c->validity(valid);
  c->buffers[0] = nulls ? c->bits.data() : nullptr;
  c->buffers[1] = c->offsets.data();
  c->buffers[2] = c->chars.data();
  c->seal(static_cast<int64_t>(xs.size()), 0, 3, nulls);
  return c;
}

// {key, namespace}, the namespaced keys input; `offset` != 0 makes it malformed on purpose.
std::shared_ptr<Col> key_ns(std::shared_ptr<Col> key, std::shared_ptr<Col> ns, int64_t offset = 0) {
  auto c = std::make_shared<Col>();
  c->format = "+s";
  c->kids = {key, ns};
  c->seal(key->array.length - offset, offset, 1, 0);
  return c;
}

BatchKeySpec ns_spec(KeyType key, KeyType ns) {
  BatchKeySpec sp;
  sp.key = KeySchema::scalar(key);
  sp.has_namespace = true;
  sp.ns = KeySchema::scalar(ns);
  return sp;
}

std::map<std::string, std::string> dump(StateTable& t) {
  std::map<std::string, std::string> out;
  for (int32_t kg = t.kg_start(); kg <= t.kg_end(); ++kg)
    t.map(kg).for_each([&](ByteView k, ByteView v) {
      out[std::string(reinterpret_cast<const char*>(k.data), k.size)] =
          std::string(reinterpret_cast<const char*>(v.data), v.size);
    });
  return out;
}

std::string bytes_of(const KeyEncoder& e) {
  return std::string(reinterpret_cast<const char*>(e.data()), e.size());
}

std::string le(int64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
  return s;
}

bool batch_error(void (*fn)(StateTable&), StateTable& t, const std::string& needle) {
  try {
    fn(t);
  } catch (const BatchError& e) {
    if (std::string(e.what()).find(needle) != std::string::npos) return true;
    std::fprintf(stderr, "unexpected message: %s\n", e.what());
    return false;
  }
  return false;
}

std::shared_ptr<Col> i32(const std::vector<int32_t>& xs) {
  auto c = std::make_shared<Col>();
  c->format = "i";
  c->fixed.resize(xs.size() * 4 + 4);
  if (!xs.empty()) std::memcpy(c->fixed.data(), xs.data(), xs.size() * 4);
  c->buffers[1] = c->fixed.data();
  c->seal(static_cast<int64_t>(xs.size()), 0, 2, 0);
  return c;
}

}  // namespace

TEST(every_key_and_namespace_combination_on_both_encoding_paths) {
  // 20k rows twice: the second batch meets a table of 20k entries, so the kernels take the
  // prefetching path (keys encoded a group ahead) as well as the direct one.
  const int n = 20000;
  for (KeyType kt : {KeyType::Int64, KeyType::String}) {
    for (KeyType nt : {KeyType::Int32, KeyType::Int64, KeyType::String}) {
      StateTable t(0, 127);
      const BatchKeySpec sp = ns_spec(kt, nt);
      std::vector<std::optional<int64_t>> ik, in, vals;
      std::vector<std::optional<std::string>> sk, sn;
      std::vector<int32_t> i32n;
      for (int r = 0; r < n; ++r) {
        ik.push_back(r / 3);
        sk.push_back("key" + std::to_string(r / 3));
        in.push_back(int64_t{r % 3} - 1);
        i32n.push_back(r % 3 - 1);
        sn.push_back(std::string(static_cast<size_t>(r % 3), 'n'));
        vals.push_back(r);
      }
      auto keys =
          key_ns(kt == KeyType::Int64 ? i64(ik) : utf8(sk), nt == KeyType::Int64   ? i64(in)
                                                            : nt == KeyType::Int32 ? i32(i32n)
                                                                                   : utf8(sn));
      auto v = i64(vals);
      put_batch(t, sp, keys->in(), ValueType::Int64, v->in());
      put_batch(t, sp, keys->in(), ValueType::Int64, v->in());
      const NamespaceType nst = nt == KeyType::Int64   ? NamespaceType::Int64
                                : nt == KeyType::Int32 ? NamespaceType::Int32
                                                       : NamespaceType::String;
      KeyEncoder enc(KeySchema::scalar(kt), nst, 128);
      std::map<std::string, std::string> want;
      for (int r = 0; r < n; ++r) {
        if (kt == KeyType::Int64) {
          enc.key_int64(key_group_for_int64(Assigner::Spark, *ik[r], 128), *ik[r]);
        } else {
          enc.key_bytes(key_group_for_string(Assigner::Spark, sk[r]->data(), sk[r]->size(), 128),
                        sk[r]->data(), sk[r]->size());
        }
        if (nt == KeyType::Int64) {
          enc.namespace_int64(*in[r]);
        } else {
          std::vector<uint8_t> ser;
          if (nt == KeyType::Int32) append_ser_int32(ser, i32n[r]);
          else append_ser_bytes(ser, sn[r]->data(), sn[r]->size());
          enc.namespace_serialized(ser.data(), ser.size());
        }
        want[bytes_of(enc)] = le(r);
      }
      CHECK_EQ(want.size(), size_t(n));
      CHECK(dump(t) == want);
    }
  }
}

namespace {}  // namespace

TEST(int64_key_int64_namespace_entries_are_the_per_record_encoding) {
  StateTable t(0, 127);
  const BatchKeySpec sp = ns_spec(KeyType::Int64, KeyType::Int64);
  // Key 7 under namespaces 100 and 200 (two entries), key 8 under 100; a repeated (7, 100).
  auto keys = key_ns(i64({7, 7, 8, 7}), i64({100, 200, 100, 100}));
  auto vals = i64({1, 2, 3, 4});
  put_batch(t, sp, keys->in(), ValueType::Int64, vals->in());
  KeyEncoder enc(KeyType::Int64, NamespaceType::Int64, 128);
  std::map<std::string, std::string> want;
  const int64_t ks[] = {7, 7, 8}, ns[] = {100, 200, 100}, vs[] = {4, 2, 3};
  for (int i = 0; i < 3; ++i) {
    enc.key_int64(key_group_for_int64(Assigner::Spark, ks[i], 128), ks[i]);
    enc.namespace_int64(ns[i]);
    want[bytes_of(enc)] = le(vs[i]);
  }
  CHECK(dump(t) == want);

  // get and add address the same entries; (8, 200) is absent.
  auto gk = key_ns(i64({8, 7, 8}), i64({100, 200, 200}));
  int64_t out[3] = {0, 0, 0};
  uint8_t valid[3] = {9, 9, 9};
  get_batch_fixed(t, sp, gk->in(), ValueType::Int64, out, valid);
  CHECK_EQ(out[0], int64_t{3});
  CHECK_EQ(out[1], int64_t{2});
  CHECK_EQ(int(valid[0]), 1);
  CHECK_EQ(int(valid[1]), 1);
  CHECK_EQ(int(valid[2]), 0);
  auto ak = key_ns(i64({8, 8, 7}), i64({200, 200, 200}));
  auto av = i64({5, 6, 10});
  add_batch(t, sp, ak->in(), ValueType::Int64, Reducer::Sum, av->in(), out, valid);
  CHECK_EQ(out[0], int64_t{5});
  CHECK_EQ(out[1], int64_t{11});
  CHECK_EQ(out[2], int64_t{12});
  CHECK_EQ(dump(t).size(), size_t{4});
}

TEST(string_key_string_namespace_carry_lenbytes) {
  // Both variable-length: ser(key) | lenbytes | ser(ns) | lenbytes (Flink's ambiguity rule).
  StateTable t(0, 127);
  const BatchKeySpec sp = ns_spec(KeyType::String, KeyType::String);
  auto keys = key_ns(utf8({"ab", "a", ""}), utf8({"c", "bc", "abc"}));
  auto vals = i64({1, 2, 3});
  put_batch(t, sp, keys->in(), ValueType::Int64, vals->in());
  KeyEncoder enc(KeyType::String, NamespaceType::String, 128);
  std::map<std::string, std::string> want;
  const char* ks[] = {"ab", "a", ""};
  const char* ns[] = {"c", "bc", "abc"};
  for (int i = 0; i < 3; ++i) {
    enc.key_bytes(key_group_for_string(Assigner::Spark, ks[i], std::strlen(ks[i]), 128), ks[i],
                  std::strlen(ks[i]));
    enc.namespace_string(ns[i], std::strlen(ns[i]));
    want[bytes_of(enc)] = le(i + 1);
  }
  CHECK_EQ(want.size(), size_t{3});  // "ab"+"c", "a"+"bc", ""+"abc": three distinct entries
  CHECK(dump(t) == want);
}

TEST(list_append_under_namespaces) {
  StateTable t(0, 127);
  const BatchKeySpec sp = ns_spec(KeyType::Int64, KeyType::String);
  auto keys = key_ns(i64({1, 1, 1}), utf8({"w1", "w2", "w1"}));
  auto vals = i64({10, 20, 30});
  ListIndex ix(0, 127);
  list_append_batch(t, sp, keys->in(), ValueType::Int64, vals->in(), TtlBatchSpec(), &ix);
  KeyEncoder enc(KeyType::Int64, NamespaceType::String, 128);
  const int32_t kg = key_group_for_int64(Assigner::Spark, 1, 128);
  enc.key_int64(kg, 1);
  enc.namespace_string("w1", 2);
  // One chunk per list: w1's chunk 0 holds 10 and 30, w2's 20.
  const auto d = dump(t);
  CHECK_EQ(d.size(), size_t{2});
  const std::string w1 = bytes_of(enc);
  CHECK(d.count(w1 + std::string(8, '\0')) == 1);
  if (d.count(w1 + std::string(8, '\0'))) CHECK(d.at(w1 + std::string(8, '\0')) == le(10) + le(30));
  CHECK_EQ(ix.lists(), size_t{0});
}

TEST(bad_namespaces_raise_before_any_mutation) {
  StateTable t(0, 127);
  {
    const BatchKeySpec sp = ns_spec(KeyType::Int64, KeyType::Int64);
    auto keys = key_ns(i64({1}), i64({5}));
    auto vals = i64({1});
    put_batch(t, sp, keys->in(), ValueType::Int64, vals->in());
  }
  const auto before = dump(t);
  // A null namespace in a later row: nothing of the batch is applied.
  CHECK(batch_error(
      [](StateTable& tt) {
        auto keys = key_ns(i64({2, 3}), i64({5, std::nullopt}));
        auto vals = i64({1, 1});
        put_batch(tt, ns_spec(KeyType::Int64, KeyType::Int64), keys->in(), ValueType::Int64,
                  vals->in());
      },
      t, "namespaces: null namespace at row 1"));
  // Namespaces of another type than the spec's.
  CHECK(batch_error(
      [](StateTable& tt) {
        auto keys = key_ns(i64({2}), utf8({"x"}));
        auto vals = i64({1});
        put_batch(tt, ns_spec(KeyType::Int64, KeyType::Int64), keys->in(), ValueType::Int64,
                  vals->in());
      },
      t, "namespaces: expected an Arrow array of key type int64"));
  // Plain keys where {key, namespace} is expected, and a sliced struct.
  CHECK(batch_error(
      [](StateTable& tt) {
        auto keys = i64({2});
        auto vals = i64({1});
        put_batch(tt, ns_spec(KeyType::Int64, KeyType::Int64), keys->in(), ValueType::Int64,
                  vals->in());
      },
      t, "struct array {key, namespace}"));
  CHECK(batch_error(
      [](StateTable& tt) {
        auto keys = key_ns(i64({2, 3}), i64({5, 6}), 1);
        auto vals = i64({1});
        put_batch(tt, ns_spec(KeyType::Int64, KeyType::Int64), keys->in(), ValueType::Int64,
                  vals->in());
      },
      t, "offset 0"));
  // A namespace type the state cannot have.
  CHECK(batch_error(
      [](StateTable& tt) {
        auto keys = key_ns(i64({2}), i64({5}));
        auto vals = i64({1});
        put_batch(tt, ns_spec(KeyType::Int64, KeyType::Float64), keys->in(), ValueType::Int64,
                  vals->in());
      },
      t, "namespace type float64 is not supported"));
  // A null key is still named as one.
  CHECK(batch_error(
      [](StateTable& tt) {
        auto keys = key_ns(i64({std::nullopt}), i64({5}));
        auto vals = i64({1});
        put_batch(tt, ns_spec(KeyType::Int64, KeyType::Int64), keys->in(), ValueType::Int64,
                  vals->in());
      },
      t, "null key at row 0"));
  CHECK(dump(t) == before);
}

TEST_MAIN()
