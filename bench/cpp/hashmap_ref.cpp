// The C++ reference of the peer benchmarks (bench/peers.py, bench/collection_states.py): the
// practical limit of a hash map on the machine for the work the native backend's batch kernels
// do. bench/cpp_reference.py compiles it at run time with the system g++ -O2
// (-DSTATECORE_REF_ABSL and the absl libraries when absl/container/flat_hash_map.h is found,
// else std::unordered_map) and feeds it the same workload as the Python side, as raw
// little-endian files written with numpy.
//
// Modes (one JSON object on stdout; only the loops are timed, std::chrono::steady_clock):
//
//   int64  KEYS OUT         KEYS: n int64. For each row map[key] += 1 and the running count is
//                           written to a per-row output array (what ReducingState sum add_batch
//                           with all-ones values returns). OUT: that array (n int64), or "-".
//   string OFFSETS DATA OUT the same with string keys: OFFSETS n+1 int64 into DATA (bytes).
//   binary PUT_KEYS PUT_OFFSETS PUT_DATA GET_KEYS OUT_OFFSETS OUT_DATA
//                           get/put of binary values by int64 key: first map[key] = value for
//                           each put row (values PUT_DATA[PUT_OFFSETS[i]:PUT_OFFSETS[i+1]]),
//                           then for each get row the value is appended to an output buffer
//                           (n+1 int64 offsets, bytes; a missing key gives an empty value and a
//                           0 in the validity array), as ValueState get_batch builds its result.
//   list KEYS VALUES        ListState append: for each row map[key].push_back(value) into a
//                           std::vector<int64> per key (KEYS, VALUES: n int64 each). Reports
//                           the distinct keys and the total elements held.
//   map KEYS USER_KEYS VALUES
//                           MapState put: for each row map[key][user_key] = value, the inner map
//                           a small vector of (user key, value) kept sorted by user key (the
//                           state's user maps hold a few entries: a sorted vector beats a hash
//                           map there, as the native blob does). Reports distinct keys and pairs.
//   list_get KEYS VALUES GET_KEYS
//                           ListState get: the lists of `list` built (untimed), then for each
//                           get row the key's elements are appended to one output vector with
//                           n+1 int64 offsets (a missing key: an empty list), as the list read
//                           kernel builds a list<int64> result. Reports rows and elements out.
//   map_get KEYS USER_KEYS VALUES GET_KEYS GET_USER_KEYS
//                           MapState get: the maps of `map` built (untimed), then for each get
//                           row the value of (key, user key) is written to an int64 output and
//                           a validity byte (0 when absent). Reports rows and values found.
//   memory N                insert keys 0..N-1 (value = key) and report the growth of this
//                           process's RSS (/proc/self/statm) in bytes.
//
// Errors (bad arguments, unreadable files) print a message to stderr and exit with status 2.

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#ifdef STATECORE_REF_ABSL
#include <absl/container/flat_hash_map.h>
template <class K, class V>
using Map = absl::flat_hash_map<K, V>;
static const char* const kMapName = "absl::flat_hash_map";
#else
#include <unordered_map>
template <class K, class V>
using Map = std::unordered_map<K, V>;
static const char* const kMapName = "std::unordered_map";
#endif

namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "hashmap_ref: %s\n", msg.c_str());
  std::exit(2);
}

template <class T>
std::vector<T> read_all(const char* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) die(std::string("cannot open ") + path);
  std::fseek(f, 0, SEEK_END);
  long bytes = std::ftell(f);
  std::fseek(f, 0, SEEK_SET);
  if (bytes < 0 || bytes % static_cast<long>(sizeof(T)) != 0)
    die(std::string("bad size of ") + path);
  std::vector<T> out(static_cast<size_t>(bytes) / sizeof(T));
  if (!out.empty() && std::fread(out.data(), sizeof(T), out.size(), f) != out.size())
    die(std::string("short read of ") + path);
  std::fclose(f);
  return out;
}

template <class T>
void write_all(const char* path, const T* data, size_t n) {
  if (std::strcmp(path, "-") == 0) return;
  std::FILE* f = std::fopen(path, "wb");
  if (!f) die(std::string("cannot write ") + path);
  if (n && std::fwrite(data, sizeof(T), n, f) != n) die(std::string("short write of ") + path);
  std::fclose(f);
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

long rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (!f || std::fscanf(f, "%ld %ld", &size, &resident) != 2) die("cannot read /proc/self/statm");
  std::fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

// std::unordered_map has no heterogeneous lookup in C++17: the natural code builds a std::string
// per row. absl's string hash is transparent, so a string_view finds without allocating and a
// std::string is built only on insert -- what a careful user of either map would write.
// (absl::string_view: Debian builds absl with its own string_view class, not std's alias.)
template <class M>
int64_t& count_slot(M& m, std::string_view k) {
#ifdef STATECORE_REF_ABSL
  return m[absl::string_view(k.data(), k.size())];
#else
  return m[std::string(k)];
#endif
}

int run_int64(const char* keys_path, const char* out_path) {
  std::vector<int64_t> keys = read_all<int64_t>(keys_path);
  std::vector<int64_t> out(keys.size());
  Map<int64_t, int64_t> m;  // not reserved: the native backend does not know the key count either
  auto t0 = Clock::now();
  for (size_t i = 0; i < keys.size(); ++i) out[i] = (m[keys[i]] += 1);
  double dt = seconds_since(t0);
  int64_t checksum = 0;  // also keeps the per-row output observable
  for (int64_t v : out) checksum += v;
  write_all(out_path, out.data(), out.size());
  std::printf(
      "{\"map\": \"%s\", \"rows\": %zu, \"seconds\": %.9f, \"distinct\": %zu, \"checksum\": "
      "%lld}\n",
      kMapName, keys.size(), dt, m.size(), static_cast<long long>(checksum));
  return 0;
}

int run_string(const char* offsets_path, const char* data_path, const char* out_path) {
  std::vector<int64_t> off = read_all<int64_t>(offsets_path);
  std::vector<char> data = read_all<char>(data_path);
  if (off.empty()) die("empty offsets");
  size_t n = off.size() - 1;
  if (static_cast<size_t>(off[n]) > data.size()) die("offsets past the data");
  std::vector<int64_t> out(n);
  Map<std::string, int64_t> m;
  auto t0 = Clock::now();
  for (size_t i = 0; i < n; ++i) {
    std::string_view k(data.data() + off[i], static_cast<size_t>(off[i + 1] - off[i]));
    out[i] = (count_slot(m, k) += 1);
  }
  double dt = seconds_since(t0);
  int64_t checksum = 0;
  for (int64_t v : out) checksum += v;
  write_all(out_path, out.data(), out.size());
  std::printf(
      "{\"map\": \"%s\", \"rows\": %zu, \"seconds\": %.9f, \"distinct\": %zu, \"checksum\": "
      "%lld}\n",
      kMapName, n, dt, m.size(), static_cast<long long>(checksum));
  return 0;
}

int run_binary(const char* put_keys_path, const char* put_off_path, const char* put_data_path,
               const char* get_keys_path, const char* out_off_path, const char* out_data_path) {
  std::vector<int64_t> pk = read_all<int64_t>(put_keys_path);
  std::vector<int64_t> poff = read_all<int64_t>(put_off_path);
  std::vector<char> pdata = read_all<char>(put_data_path);
  std::vector<int64_t> gk = read_all<int64_t>(get_keys_path);
  if (poff.size() != pk.size() + 1) die("put offsets do not match the put keys");
  if (static_cast<size_t>(poff.back()) > pdata.size()) die("offsets past the data");
  // std::string values: the state holds variable-length binary values, as the backends do.
  Map<int64_t, std::string> m;
  auto t0 = Clock::now();
  for (size_t i = 0; i < pk.size(); ++i)
    m[pk[i]].assign(pdata.data() + poff[i], static_cast<size_t>(poff[i + 1] - poff[i]));
  double put_s = seconds_since(t0);

  // The row count is known, so offsets and validity are sized up front; the bytes grow.
  std::vector<int64_t> ooff(gk.size() + 1);
  std::vector<uint8_t> valid(gk.size());
  std::vector<char> odata;
  t0 = Clock::now();
  ooff[0] = 0;
  for (size_t i = 0; i < gk.size(); ++i) {
    auto it = m.find(gk[i]);
    if (it != m.end()) {
      odata.insert(odata.end(), it->second.begin(), it->second.end());
      valid[i] = 1;
    }
    ooff[i + 1] = static_cast<int64_t>(odata.size());
  }
  double get_s = seconds_since(t0);
  size_t present = 0;
  for (uint8_t v : valid) present += v;
  write_all(out_off_path, ooff.data(), ooff.size());
  write_all(out_data_path, odata.data(), odata.size());
  std::printf(
      "{\"map\": \"%s\", \"put_rows\": %zu, \"put_seconds\": %.9f, \"get_rows\": %zu, "
      "\"get_seconds\": %.9f, \"distinct\": %zu, \"present\": %zu, \"out_bytes\": %zu}\n",
      kMapName, pk.size(), put_s, gk.size(), get_s, m.size(), present, odata.size());
  return 0;
}

int run_list(const char* keys_path, const char* values_path) {
  std::vector<int64_t> keys = read_all<int64_t>(keys_path);
  std::vector<int64_t> values = read_all<int64_t>(values_path);
  if (values.size() != keys.size()) die("values do not match the keys");
  Map<int64_t, std::vector<int64_t>> m;
  auto t0 = Clock::now();
  for (size_t i = 0; i < keys.size(); ++i) m[keys[i]].push_back(values[i]);
  double dt = seconds_since(t0);
  size_t elements = 0;
  for (const auto& kv : m) elements += kv.second.size();
  std::printf(
      "{\"map\": \"%s\", \"rows\": %zu, \"seconds\": %.9f, \"distinct\": %zu, \"elements\": %zu}\n",
      kMapName, keys.size(), dt, m.size(), elements);
  return 0;
}

int run_map(const char* keys_path, const char* user_keys_path, const char* values_path) {
  std::vector<int64_t> keys = read_all<int64_t>(keys_path);
  std::vector<int64_t> uks = read_all<int64_t>(user_keys_path);
  std::vector<int64_t> values = read_all<int64_t>(values_path);
  if (uks.size() != keys.size() || values.size() != keys.size())
    die("user keys or values do not match the keys");
  using Pairs = std::vector<std::pair<int64_t, int64_t>>;
  Map<int64_t, Pairs> m;
  auto t0 = Clock::now();
  for (size_t i = 0; i < keys.size(); ++i) {
    Pairs& p = m[keys[i]];
    auto it = std::lower_bound(
        p.begin(), p.end(), uks[i],
        [](const std::pair<int64_t, int64_t>& a, int64_t k) { return a.first < k; });
    if (it != p.end() && it->first == uks[i]) it->second = values[i];
    else p.insert(it, {uks[i], values[i]});
  }
  double dt = seconds_since(t0);
  size_t pairs = 0;
  int64_t checksum = 0;
  for (const auto& kv : m) {
    pairs += kv.second.size();
    for (const auto& e : kv.second) checksum += e.second;
  }
  std::printf(
      "{\"map\": \"%s\", \"rows\": %zu, \"seconds\": %.9f, \"distinct\": %zu, \"pairs\": %zu, "
      "\"checksum\": %lld}\n",
      kMapName, keys.size(), dt, m.size(), pairs, static_cast<long long>(checksum));
  return 0;
}

int run_list_get(const char* keys_path, const char* values_path, const char* get_path) {
  std::vector<int64_t> keys = read_all<int64_t>(keys_path);
  std::vector<int64_t> values = read_all<int64_t>(values_path);
  std::vector<int64_t> gk = read_all<int64_t>(get_path);
  if (values.size() != keys.size()) die("values do not match the keys");
  Map<int64_t, std::vector<int64_t>> m;
  for (size_t i = 0; i < keys.size(); ++i) m[keys[i]].push_back(values[i]);
  std::vector<int64_t> offsets(1, 0), out;
  auto t0 = Clock::now();
  offsets.reserve(gk.size() + 1);
  for (int64_t k : gk) {
    auto it = m.find(k);
    if (it != m.end()) out.insert(out.end(), it->second.begin(), it->second.end());
    offsets.push_back(static_cast<int64_t>(out.size()));
  }
  double dt = seconds_since(t0);
  std::printf("{\"map\": \"%s\", \"rows\": %zu, \"seconds\": %.9f, \"elements\": %zu}\n", kMapName,
              gk.size(), dt, out.size());
  return 0;
}

int run_map_get(const char* keys_path, const char* user_keys_path, const char* values_path,
                const char* get_path, const char* get_uks_path) {
  std::vector<int64_t> keys = read_all<int64_t>(keys_path);
  std::vector<int64_t> uks = read_all<int64_t>(user_keys_path);
  std::vector<int64_t> values = read_all<int64_t>(values_path);
  std::vector<int64_t> gk = read_all<int64_t>(get_path);
  std::vector<int64_t> gu = read_all<int64_t>(get_uks_path);
  if (uks.size() != keys.size() || values.size() != keys.size() || gu.size() != gk.size())
    die("user keys or values do not match the keys");
  using Pairs = std::vector<std::pair<int64_t, int64_t>>;
  auto less = [](const std::pair<int64_t, int64_t>& a, int64_t k) { return a.first < k; };
  Map<int64_t, Pairs> m;
  for (size_t i = 0; i < keys.size(); ++i) {
    Pairs& p = m[keys[i]];
    auto it = std::lower_bound(p.begin(), p.end(), uks[i], less);
    if (it != p.end() && it->first == uks[i]) it->second = values[i];
    else p.insert(it, {uks[i], values[i]});
  }
  std::vector<int64_t> out(gk.size(), 0);
  std::vector<uint8_t> valid(gk.size(), 0);
  auto t0 = Clock::now();
  for (size_t i = 0; i < gk.size(); ++i) {
    auto mi = m.find(gk[i]);
    if (mi == m.end()) continue;
    auto it = std::lower_bound(mi->second.begin(), mi->second.end(), gu[i], less);
    if (it != mi->second.end() && it->first == gu[i]) {
      out[i] = it->second;
      valid[i] = 1;
    }
  }
  double dt = seconds_since(t0);
  size_t found = 0;
  for (uint8_t v : valid) found += v;
  std::printf("{\"map\": \"%s\", \"rows\": %zu, \"seconds\": %.9f, \"found\": %zu}\n", kMapName,
              gk.size(), dt, found);
  return 0;
}

int run_memory(const char* n_arg) {
  char* end = nullptr;
  long long n = std::strtoll(n_arg, &end, 10);
  if (!end || *end || n < 0) die(std::string("bad entry count ") + n_arg);
  long r0 = rss_bytes();
  Map<int64_t, int64_t> m;
  for (long long i = 0; i < n; ++i) m[i] = i;
  long r1 = rss_bytes();
  std::printf("{\"map\": \"%s\", \"entries\": %zu, \"rss_delta\": %ld}\n", kMapName, m.size(),
              r1 - r0);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "int64" && argc == 4) return run_int64(argv[2], argv[3]);
  if (mode == "string" && argc == 5) return run_string(argv[2], argv[3], argv[4]);
  if (mode == "binary" && argc == 8)
    return run_binary(argv[2], argv[3], argv[4], argv[5], argv[6], argv[7]);
  if (mode == "list" && argc == 4) return run_list(argv[2], argv[3]);
  if (mode == "map" && argc == 5) return run_map(argv[2], argv[3], argv[4]);
  if (mode == "list_get" && argc == 5) return run_list_get(argv[2], argv[3], argv[4]);
  if (mode == "map_get" && argc == 7)
    return run_map_get(argv[2], argv[3], argv[4], argv[5], argv[6]);
  if (mode == "memory" && argc == 3) return run_memory(argv[2]);
  if (mode == "--map" && argc == 2) {
    std::printf("{\"map\": \"%s\"}\n", kMapName);
    return 0;
  }
  die("usage: hashmap_ref int64 KEYS OUT | string OFFSETS DATA OUT | "
      "binary PUT_KEYS PUT_OFFSETS PUT_DATA GET_KEYS OUT_OFFSETS OUT_DATA | list KEYS VALUES | "
      "map KEYS USER_KEYS VALUES | list_get KEYS VALUES GET_KEYS | "
      "map_get KEYS USER_KEYS VALUES GET_KEYS GET_USER_KEYS | memory N | --map");
}
