// Background block serializer of checkpoint data files (design: snapshot_writer.h).
#include "statecore/snapshot_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <utility>

#ifdef __linux__
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "statecore/block_codec.h"
#include "statecore/hash.h"

namespace statecore {

namespace {

constexpr uint64_t kInt32Max = static_cast<uint64_t>(std::numeric_limits<int32_t>::max());

void put_u32(uint8_t* p, uint32_t v) {
  p[0] = static_cast<uint8_t>(v);
  p[1] = static_cast<uint8_t>(v >> 8);
  p[2] = static_cast<uint8_t>(v >> 16);
  p[3] = static_cast<uint8_t>(v >> 24);
}

std::string where(const std::string& state, int32_t kg) {
  return "state '" + state + "' key group " + std::to_string(kg);
}

}  // namespace

SnapshotSerializer::SnapshotSerializer(std::vector<SerializerSource> sources,
                                       SerializerOptions options)
    : sources_(std::move(sources)), opt_(options) {
  if (opt_.prefix_bytes != 1 && opt_.prefix_bytes != 2)
    throw std::invalid_argument("key-group prefix must be 1 or 2 bytes");
  if (opt_.block_target_bytes == 0) throw std::invalid_argument("block target must be > 0 bytes");
  if (opt_.queue_blocks == 0) throw std::invalid_argument("queue must hold at least one block");
  if (opt_.codec != kCodecLz4 && opt_.codec != kCodecNone)
    throw std::invalid_argument("unknown block codec " + std::to_string(opt_.codec));
  if (opt_.bloom_bits_per_key < 1 || opt_.bloom_bits_per_key > 64)
    throw std::invalid_argument("Bloom filter bits per key must be in [1, 64]");
  if (sources_.size() > std::numeric_limits<uint32_t>::max())
    throw std::invalid_argument("too many states");
  if (opt_.kg_end >= opt_.kg_start) {
    for (const auto& s : sources_) {
      if (s.table && (s.table->kg_start() > opt_.kg_start || s.table->kg_end() < opt_.kg_end))
        throw std::invalid_argument("state '" + s.name + "': table snapshot covers key groups [" +
                                    std::to_string(s.table->kg_start()) + ", " +
                                    std::to_string(s.table->kg_end()) + "], the file needs [" +
                                    std::to_string(opt_.kg_start) + ", " +
                                    std::to_string(opt_.kg_end) + "]");
    }
  }
}

SnapshotSerializer::~SnapshotSerializer() { cancel(); }

void SnapshotSerializer::start() {
  std::lock_guard<std::mutex> j(join_mu_);
  std::lock_guard<std::mutex> g(mu_);
  if (started_) throw std::logic_error("serializer already started");
  started_ = true;
  thread_ = std::thread([this] { run(); });
}

namespace {

// Linux applies setpriority(PRIO_PROCESS, tid) to that one thread. Best effort: a failure only
// leaves the thread at its inherited priority.
void lower_thread_priority(int by) {
#ifdef __linux__
  if (by <= 0) return;
  const id_t tid = static_cast<id_t>(::syscall(SYS_gettid));
  errno = 0;
  int now = ::getpriority(PRIO_PROCESS, tid);
  if (now == -1 && errno != 0) return;
  ::setpriority(PRIO_PROCESS, tid, now + by > 19 ? 19 : now + by);
#else
  (void)by;
#endif
}

}  // namespace

void SnapshotSerializer::run() {
#ifdef __linux__
  // Named so top -H, py-spy and /proc/<pid>/task show the checkpoint encoding apart from the
  // task thread that started it (a new thread inherits its creator's name).
  ::pthread_setname_np(::pthread_self(), "sc-serializer");
#endif
  lower_thread_priority(opt_.nice);
  std::exception_ptr err;
  try {
    produce();
  } catch (const SerializerCancelled&) {
    // next() reports the cancellation itself
  } catch (...) {
    err = std::current_exception();
  }
  std::lock_guard<std::mutex> g(mu_);
  error_ = err;
  done_ = true;
  not_empty_.notify_all();
}

void SnapshotSerializer::produce() {
  for (int32_t kg = opt_.kg_start; kg <= opt_.kg_end; ++kg) {
    for (size_t si = 0; si < sources_.size(); ++si) {
      if (cancelled_.load(std::memory_order_relaxed)) throw SerializerCancelled();
      serialize_group(si, kg);
    }
  }
}

void SnapshotSerializer::serialize_group(size_t si, int32_t kg) {
  SerializerSource& src = sources_[si];
  const SortedRun* run = &listed_;
  std::shared_ptr<MapSnapshot> map;
  if (src.table) {
    map = src.table->map(kg);
    if (src.changes) {
      map->sorted_changes(src.base, builder_, listed_);
    } else {
      map->sorted_entries(builder_, listed_);
    }
    // The run is a copy: the map snapshot is no longer needed.
    if (opt_.release_as_written) map->release();
    if (src.ttl_filter && !src.changes) {
      size_t expired;
      try {
        expired = ttl::filter_run(src.ttl_spec, src.ttl_now, listed_, filtered_);
      } catch (const std::invalid_argument& e) {
        throw std::invalid_argument(where(src.name, kg) + ": " + e.what());
      }
      run = &filtered_;
      std::lock_guard<std::mutex> lock(mu_);
      stats_.ttl_expired += expired;
    }
  } else {
    auto it = src.fixed.find(kg);
    if (it == src.fixed.end()) return;
    const StaticEntries& f = it->second;
    const size_t n = f.size();
    if (f.key_offsets.empty() || f.value_offsets.size() != n + 1 ||
        (!f.valid.empty() && f.valid.size() != n) || f.key_offsets[n] != f.key_data.size() ||
        f.value_offsets[n] != f.value_data.size())
      throw std::invalid_argument(where(src.name, kg) + ": keys and values do not pair up");
    for (size_t i = 0; i < n; ++i) {
      if (f.key_offsets[i] > f.key_offsets[i + 1] || f.value_offsets[i] > f.value_offsets[i + 1])
        throw std::invalid_argument(where(src.name, kg) + ": offsets are not ascending");
      if (f.removed(i) && f.value_offsets[i] != f.value_offsets[i + 1])
        throw std::invalid_argument(where(src.name, kg) + ": a tombstone with a value");
    }
    run = &f;
  }
  const SortedRun& rows = *run;
  const size_t n = rows.size();
  if (n == 0) return;
  if (!opt_.incremental && !rows.valid.empty()) {
    for (size_t i = 0; i < n; ++i)
      if (rows.removed(i))
        throw std::invalid_argument(where(src.name, kg) + ": a tombstone in a full snapshot");
  }
  // The contract checks of format.write_data_file, so both writers refuse the same snapshots.
  // A map's listing passes them by construction (its keys carry its key group's prefix, and
  // SortedRunBuilder::finish sorted them and dropped duplicates): only given entries are checked
  // (a sixth of serialize_group's time for a 197k-entry int64 listing).
  const uint64_t kbytes = rows.key_offsets[n] - rows.key_offsets[0];
  const uint64_t vbytes = rows.value_offsets[n] - rows.value_offsets[0];
  const size_t pw = static_cast<size_t>(opt_.prefix_bytes);
  for (size_t i = 0; !src.table && i < n; ++i) {
    const ByteView key = rows.key(i);
    if (key.size < pw)
      throw std::invalid_argument(where(src.name, kg) + ": an encoded key is shorter than its " +
                                  std::to_string(pw) + "-byte key-group prefix");
    int32_t got = pw == 1 ? key.data[0] : (int32_t{key.data[0]} << 8) | key.data[1];
    if (got != kg)
      throw std::invalid_argument("state '" + src.name + "': entries(..., " + std::to_string(kg) +
                                  ") returned a key with key-group prefix " + std::to_string(got));
    if (i > 0 && key_compare(rows.key(i - 1), key) >= 0)
      throw std::invalid_argument(where(src.name, kg) +
                                  ": keys are not strictly ascending by bytes");
  }
  if (kbytes > kInt32Max || vbytes > kInt32Max)
    throw std::invalid_argument(where(src.name, kg) + ": more than 2 GiB of bytes");

  // Cut exactly as format.cut_points: from entry i take entries while their cumulative size
  // (8 + key + value each) stays <= target - 12; at least one entry per block.
  const int64_t budget = static_cast<int64_t>(opt_.block_target_bytes) - 12;
  // The Bloom filter over every key of the group, tombstones included: a lookup must find a
  // tombstone to stop at it instead of reading an older run.
  // Built block by block while the block's keys are in cache from its copy.
  std::vector<uint8_t> filter(bloom_filter_bytes(n, opt_.bloom_bits_per_key), 0);
  const BloomShape shape(filter.size(), bloom_hashes(opt_.bloom_bits_per_key));
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    int64_t acc = 0;
    while (j < n) {
      int64_t sz = 8 + static_cast<int64_t>(rows.key(j).size + rows.value(j).size);
      if (acc + sz > budget) break;
      acc += sz;
      ++j;
    }
    if (j == i) j = i + 1;
    const size_t m = j - i;
    uint32_t tomb = 0;
    for (size_t r = i; r < j; ++r) tomb += rows.removed(r);
    // Keys (values) of consecutive entries are contiguous in the run: one copy per block.
    const uint64_t kb = rows.key_offsets[j] - rows.key_offsets[i];
    const uint64_t vb = rows.value_offsets[j] - rows.value_offsets[i];
    const size_t bitmap = opt_.incremental ? (m + 7) / 8 : 0;
    BlockPayload p;
    p.key_group = kg;
    p.state = static_cast<uint32_t>(si);
    p.entries = static_cast<uint32_t>(m);
    p.tombstones = tomb;
    p.last_of_group = j == n;
    const ByteView last = rows.key(j - 1);
    p.last_key.assign(last.data, last.data + last.size);
    p.bytes.assign(4 + 8 * (m + 1) + kb + vb + bitmap, 0);
    uint8_t* out = p.bytes.data();
    put_u32(out, static_cast<uint32_t>(m));
    uint8_t* ko = out + 4;
    uint8_t* vo = ko + 4 * (m + 1);
    uint8_t* kd = vo + 4 * (m + 1);
    uint8_t* vd = kd + kb;
    uint8_t* bits = vd + vb;
    if (kb) std::memcpy(kd, rows.key_data.data() + rows.key_offsets[i], kb);
    if (vb) std::memcpy(vd, rows.value_data.data() + rows.value_offsets[i], vb);
    for (size_t e = 0; e <= m; ++e) {
      put_u32(ko + 4 * e, static_cast<uint32_t>(rows.key_offsets[i + e] - rows.key_offsets[i]));
      put_u32(vo + 4 * e, static_cast<uint32_t>(rows.value_offsets[i + e] - rows.value_offsets[i]));
      if (opt_.incremental && e < m && !rows.removed(i + e))
        bits[e / 8] |= static_cast<uint8_t>(1u << (e % 8));
    }
    shape.add_keys(filter.data(), rows.key_offsets.data(), rows.key_data.data(), i, j);
    if (p.last_of_group) p.filter = std::move(filter);
    i = j;
    emit(std::move(p));
  }
}

// Hand-over with hysteresis: a producer that found the queue full sleeps until the consumer
// drained it to half (low_water()), and a consumer that found it empty sleeps until the producer
// filled it to half (or finished). Waking the other side per payload would cost two thread
// switches per block on a full (or empty) queue -- thousands a second with small blocks, taken
// from the processing threads on a machine with few cores.
size_t SnapshotSerializer::low_water() const { return opt_.queue_blocks / 2; }

void SnapshotSerializer::emit(BlockPayload&& p) {
  std::unique_lock<std::mutex> lk(mu_);
  if (queue_.size() >= opt_.queue_blocks) {
    ++stats_.producer_waits;
    producer_waiting_ = true;
    not_full_.wait(lk, [this] {
      return queue_.size() <= low_water() || cancelled_.load(std::memory_order_relaxed);
    });
    producer_waiting_ = false;
  }
  if (cancelled_.load(std::memory_order_relaxed)) throw SerializerCancelled();
  ++stats_.blocks;
  stats_.payload_bytes += p.bytes.size();
  queue_.push_back(std::move(p));
  if (queue_.size() > stats_.max_queued) stats_.max_queued = queue_.size();
  if (consumer_waiting_ && queue_.size() >= std::max<size_t>(low_water(), 1))
    not_empty_.notify_one();
}

bool SnapshotSerializer::next(BlockPayload* out) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!started_) throw std::logic_error("serializer not started");
  if (queue_.empty()) {
    consumer_waiting_ = true;
    not_empty_.wait(lk, [this] {
      return queue_.size() >= std::max<size_t>(low_water(), 1) || done_ ||
             cancelled_.load(std::memory_order_relaxed);
    });
    consumer_waiting_ = false;
  }
  if (cancelled_.load(std::memory_order_relaxed)) throw SerializerCancelled();
  if (!queue_.empty()) {
    *out = std::move(queue_.front());
    queue_.pop_front();
    if (producer_waiting_ && queue_.size() <= low_water()) not_full_.notify_one();
    return true;
  }
  if (error_) std::rethrow_exception(error_);
  return false;
}

void SnapshotSerializer::cancel() {
  {
    std::lock_guard<std::mutex> g(mu_);
    cancelled_.store(true, std::memory_order_relaxed);
    queue_.clear();
    not_full_.notify_all();
    not_empty_.notify_all();
  }
  // Two threads may cancel at once (the consumer's error path and a Future.cancel()).
  std::lock_guard<std::mutex> j(join_mu_);
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

SnapshotSerializer::Stats SnapshotSerializer::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return stats_;
}

bool SnapshotSerializer::next_chunk(BlockChunk* out, size_t target_bytes) {
  out->bytes.clear();
  out->blocks.clear();
  // One allocation for the chunk instead of doublings that copy what is compressed so far (a
  // block can end the chunk past the target by at most one block's bound).
  out->bytes.reserve(std::min<size_t>(target_bytes, size_t{16} << 20) +
                     block_encode_bound(opt_.codec, opt_.block_target_bytes) + 64);
  BlockPayload p;
  try {
    while (out->blocks.empty() || out->bytes.size() < target_bytes) {
      if (!next(&p)) break;
      StoredBlock b;
      b.key_group = p.key_group;
      b.state = p.state;
      b.entries = p.entries;
      b.tombstones = p.tombstones;
      b.last_of_group = p.last_of_group;
      b.last_key = std::move(p.last_key);
      b.filter = std::move(p.filter);
      b.offset = out->bytes.size();
      b.raw_length = p.bytes.size();
      b.stored_length = block_encode(opt_.codec, p.bytes.data(), p.bytes.size(), &out->bytes);
      b.xxh64 = xxh64(out->bytes.data() + b.offset, b.stored_length, 0);
      out->blocks.push_back(b);
    }
  } catch (...) {
    out->bytes.clear();
    out->blocks.clear();
    throw;
  }
  return !out->blocks.empty();
}

}  // namespace statecore
