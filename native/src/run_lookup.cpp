#include "statecore/run_lookup.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <utility>

#include "statecore/payload_lookup.h"

namespace statecore {

bool open_table_block_into(const RunBlockTable& table, int64_t b, const uint8_t* data, size_t size,
                           uint64_t base, uint8_t* out, std::string* why) {
  StoredBlockRef ref = table.blocks[b];
  // An offset before `base` wraps to a huge one, which open_block's bounds check rejects.
  ref.offset -= base;
  const int64_t a = table.key_offsets[b];
  const uint8_t* last = table.key_data + a;
  const size_t last_size = static_cast<size_t>(table.key_offsets[b + 1] - a);
  return open_blocks_into(data, size, &ref, 1, table.has_validity, &last, &last_size, &out, why) <
         0;
}

BlockRef open_table_block(const RunBlockTable& table, int64_t b, const uint8_t* data, size_t size,
                          uint64_t base, std::string* why) {
  const uint64_t raw = table.blocks[b].raw_length;
  auto opened = std::make_shared<OpenedBlock>();
  // At least one byte: LZ4 gets no null destination.
  opened->bytes.reset(new uint8_t[std::max<uint64_t>(raw, 1)]);
  opened->size = raw;
  if (!open_table_block_into(table, b, data, size, base, opened->bytes.get(), why)) return nullptr;
  return opened;
}

LookupStep::LookupStep(BlockCache* cache, uint64_t open_bytes, uint64_t gap_bytes,
                       uint64_t max_read_bytes)
    : cache_(cache),
      open_bytes_(std::max<uint64_t>(open_bytes, 1)),
      gap_bytes_(gap_bytes),
      max_read_bytes_(max_read_bytes) {}

void LookupStep::add(const RunBlockTable* table, const int64_t* keys, const int64_t* blocks,
                     size_t n) {
  const size_t f = files_.size();
  files_.push_back(table);
  entries_.reserve(entries_.size() + n);
  for (size_t i = 0; i < n; ++i) entries_.push_back(Entry{f, blocks[i], keys[i]});
  planned_ = false;
}

void LookupStep::set_keys(const int32_t* key_offsets, const uint8_t* key_data) {
  key_offsets_ = key_offsets;
  key_data_ = key_data;
}

void LookupStep::plan() {
  // Files in add() order, blocks ascending within one: a file's blocks stay adjacent so that
  // its missing blocks coalesce into ranged reads. Then key indices, which are distinct within
  // a file: a total order, so that an unstable sort (introsort, without a merge buffer) gives
  // one answer.
  std::sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    if (a.file != b.file) return a.file < b.file;
    return a.block != b.block ? a.block < b.block : a.key < b.key;
  });
  unique_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (unique_.empty() || unique_.back().file != entries_[i].file ||
        unique_.back().block != entries_[i].block) {
      unique_.push_back(Unique{entries_[i].file, entries_[i].block, i, i});
    }
    unique_.back().end = i + 1;
  }
  next_unique_ = 0;
  planned_ = true;
}

bool LookupStep::next_round(size_t slot) {
  if (!planned_) plan();
  Round& rd = rounds_[slot];
  rd.pins.clear();
  rd.missing.clear();
  rd.missing_slot.clear();
  rd.ranges.clear();
  rd.bytes = 0;
  rd.hits = 0;
  if (next_unique_ >= unique_.size()) {
    rd.begin = rd.end = unique_.size();
    rd.key_begin = rd.key_end = entries_.size();
    return false;
  }
  rd.begin = next_unique_;
  size_t e = rd.begin;
  while (e < unique_.size()) {
    const uint64_t size = files_[unique_[e].file]->blocks[unique_[e].block].raw_length;
    if (e > rd.begin && rd.bytes + size > open_bytes_) break;
    rd.bytes += size;
    ++e;
  }
  rd.end = next_unique_ = e;
  rd.key_begin = unique_[rd.begin].begin;
  rd.key_end = unique_[rd.end - 1].end;
  const size_t n = rd.end - rd.begin;
  rd.pins.resize(n);
  rd.searched.assign(n, 0);
  rd.found.resize(rd.key_end - rd.key_begin);
  probe_files_.resize(n);
  probe_blocks_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    probe_files_[i] = files_[unique_[rd.begin + i].file]->file_id;
    probe_blocks_[i] = unique_[rd.begin + i].block;
  }
  cache_->get_many(probe_files_.data(), probe_blocks_.data(), n, rd.pins.data());
  for (size_t u = rd.begin; u < rd.end; ++u) {
    const Unique& q = unique_[u];
    if (rd.pins[u - rd.begin]) {
      ++rd.hits;
      continue;
    }
    const StoredBlockRef& ref = files_[q.file]->blocks[q.block];
    const uint64_t start = ref.offset, end = ref.offset + ref.stored_length;
    ReadRange* last = rd.ranges.empty() ? nullptr : &rd.ranges.back();
    const bool join = last != nullptr && last->file == q.file &&
                      start >= last->offset + last->length &&
                      start - (last->offset + last->length) <= gap_bytes_ &&
                      end - last->offset <= max_read_bytes_;
    if (join) {
      last->length = end - last->offset;
      ++last->count;
    } else {
      rd.ranges.push_back(ReadRange{q.file, start, end - start, rd.missing.size(), 1});
    }
    rd.missing.emplace_back(q.file, q.block);
    rd.missing_slot.push_back(u - rd.begin);
  }
  return true;
}

int64_t LookupStep::open_range(size_t r, const uint8_t* data, size_t size, std::string* why,
                               size_t slot) {
  Round& rd = rounds_[slot];
  const ReadRange& range = rd.ranges[r];
  const RunBlockTable& table = *files_[range.file];
  // The range's opened blocks go into the cache together (one lock per read, not per block);
  // those opened before a bad block are still cached and pinned. Scratch per thread: a call
  // per read, on every fetch thread.
  thread_local std::vector<int64_t> ids, numbers;
  thread_local std::vector<BlockRef> blocks;
  ids.assign(range.count, table.file_id);
  numbers.resize(range.count);
  blocks.clear();
  int64_t bad = -1;
  for (size_t opened = 0; opened < range.count; ++opened) {
    const size_t m = range.first + opened;
    numbers[opened] = rd.missing[m].second;
    BlockRef b = open_table_block(table, numbers[opened], data, size, range.offset, why);
    if (!b) {
      bad = static_cast<int64_t>(opened);
      break;
    }
    const size_t at = rd.missing_slot[m];
    rd.pins[at] = b;
    blocks.push_back(std::move(b));
    if (key_offsets_ != nullptr) {
      search_block(rd, rd.begin + at, key_offsets_, key_data_);
      rd.searched[at] = 1;
    }
  }
  cache_->put_many(ids.data(), numbers.data(), blocks.data(), blocks.size());
  blocks.clear();  // the cache and the round hold them; a thread's scratch pins none
  return bad;
}

void LookupStep::search_block(Round& rd, size_t u, const int32_t* key_offsets,
                              const uint8_t* key_data) const {
  const Unique& q = unique_[u];
  const OpenedBlock& blk = *rd.pins[u - rd.begin];
  const PayloadView v = PayloadView::of(blk.bytes.get(), blk.size, files_[q.file]->has_validity);
  for (size_t j = q.begin; j < q.end; ++j) {
    const int64_t k = entries_[j].key;
    Found& f = rd.found[j - rd.key_begin];
    f.row =
        v.find(key_data + key_offsets[k], static_cast<size_t>(key_offsets[k + 1] - key_offsets[k]));
    f.value = nullptr;
    f.size = 0;
    if (f.row >= 0 && v.has_value(f.row)) {
      const uint32_t a = v.value_offset(f.row);
      f.value = v.value_data + a;
      f.size = v.value_offset(f.row + 1) - a;
    }
  }
}

namespace {

// Reads `length` bytes at `offset` of `fd` into buffer[0, length): -1, kReadFailed or
// kReadShort (the reason in *why).
int64_t pread_all(int fd, uint64_t offset, uint64_t length, std::vector<uint8_t>* buffer,
                  std::string* why) {
  // Grown only: a shrink and a regrow would zero the regrown bytes on every read.
  if (buffer->size() < std::max<uint64_t>(length, 1)) buffer->resize(std::max<uint64_t>(length, 1));
  uint64_t got = 0;
  while (got < length) {
    const ssize_t n =
        ::pread(fd, buffer->data() + got, length - got, static_cast<off_t>(offset + got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      *why = std::strerror(errno);
      return LookupStep::kReadFailed;
    }
    if (n == 0) {
      *why = "the file ends at byte " + std::to_string(offset + got);
      return LookupStep::kReadShort;
    }
    got += static_cast<uint64_t>(n);
  }
  return -1;
}

void raise_to(std::atomic<uint64_t>* peak, uint64_t value) {
  uint64_t seen = peak->load(std::memory_order_relaxed);
  while (value > seen && !peak->compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace

bool LookupStep::run(FetchPool* pool, const int* fds, size_t nfds, size_t workers,
                     StepFailure* failure) {
  if (!planned_) plan();
  fds_.assign(fds, fds + nfds);
  const size_t threads = pool == nullptr ? 0 : std::max<size_t>(workers, 1);
  const uint64_t chunk_bytes = std::max<uint64_t>(open_bytes_ / (threads + 1), 1);
  chunks_.clear();
  for (size_t u = 0; u < unique_.size();) {
    Chunk ch;
    ch.begin = u;
    while (u < unique_.size()) {
      const uint64_t size = files_[unique_[u].file]->blocks[unique_[u].block].raw_length;
      if (u > ch.begin && ch.bytes + size > chunk_bytes) break;
      ch.bytes += size;
      ++u;
    }
    ch.end = u;
    chunks_.push_back(std::move(ch));
  }
  rows_.assign(entries_.size(), -1);
  sizes_.assign(entries_.size(), -1);
  at_.assign(entries_.size(), 0);
  next_chunk_ = 0;
  stop_ = false;
  open_now_ = peak_open_ = blocks_read_ = bytes_read_ = 0;
  failed_ = false;
  const size_t helpers = chunks_.size() > 1 ? std::min(threads, chunks_.size() - 1) : 0;
  if (helpers > 0) {
    run_done_.reset(helpers);
    pool->run(helpers, [this](size_t) { take_chunks(); }, &run_done_);
  }
  take_chunks();
  if (helpers > 0) run_done_.wait();
  counts_.blocks_read = blocks_read_;
  counts_.bytes_read = bytes_read_;
  counts_.peak_open_bytes = peak_open_;
  if (failed_) *failure = failure_;
  return !failed_;
}

void LookupStep::take_chunks() {
  // Kept across calls: the fetch threads read every step, and a fresh buffer per call would
  // be zeroed (and, at this size, mapped) each time.
  thread_local std::vector<uint8_t> buffer;
  while (!stop_.load(std::memory_order_relaxed)) {
    const size_t c = next_chunk_.fetch_add(1);
    if (c >= chunks_.size()) return;
    StepFailure f;
    bool ok = false;
    try {
      ok = run_chunk(chunks_[c], &buffer, &f);
    } catch (const std::exception& e) {  // bad_alloc: reported as a failed read
      f.bad = kReadFailed;
      f.why = e.what();
    }
    if (!ok) {
      std::lock_guard<std::mutex> g(failure_mu_);
      if (!failed_) {
        failed_ = true;
        failure_ = std::move(f);
      }
      stop_ = true;
      return;
    }
  }
}

bool LookupStep::run_chunk(Chunk& ch, std::vector<uint8_t>* buffer, StepFailure* failure) {
  const size_t n = ch.end - ch.begin;
  raise_to(&peak_open_, open_now_.fetch_add(ch.bytes) + ch.bytes);
  struct Close {  // the chunk's bytes count as open until it returns, however it returns
    std::atomic<uint64_t>* now;
    uint64_t bytes;
    ~Close() { now->fetch_sub(bytes); }
  } close{&open_now_, ch.bytes};
  thread_local std::vector<BlockRef> pins, opened;
  thread_local std::vector<int64_t> ids, numbers;
  thread_local std::vector<uint64_t> sizes;
  thread_local std::vector<uint8_t> admit, scratch;
  thread_local std::vector<int64_t> kept;
  thread_local std::vector<size_t> missing;  // unique_ indices
  thread_local std::vector<ReadRange> ranges;
  pins.assign(n, nullptr);
  ids.resize(n);
  numbers.resize(n);
  sizes.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Unique& q = unique_[ch.begin + i];
    ids[i] = files_[q.file]->file_id;
    numbers[i] = q.block;
    sizes[i] = files_[q.file]->blocks[q.block].raw_length;
  }
  // The blocks the cache would refuse (admit[i] = 0) are opened into `scratch` and searched
  // at once; the others into blocks of their own, offered to the cache.
  admit.resize(n);
  cache_->get_many(ids.data(), numbers.data(), n, pins.data(), sizes.data(), admit.data());
  missing.clear();
  ranges.clear();
  for (size_t u = ch.begin; u < ch.end; ++u) {
    if (pins[u - ch.begin]) {
      search_into(ch, u, pins[u - ch.begin]->bytes.get(), pins[u - ch.begin]->size);
      pins[u - ch.begin] = nullptr;
      continue;
    }
    const Unique& q = unique_[u];
    const StoredBlockRef& ref = files_[q.file]->blocks[q.block];
    const uint64_t start = ref.offset, end = ref.offset + ref.stored_length;
    ReadRange* last = ranges.empty() ? nullptr : &ranges.back();
    if (last != nullptr && last->file == q.file && start >= last->offset + last->length &&
        start - (last->offset + last->length) <= gap_bytes_ &&
        end - last->offset <= max_read_bytes_) {
      last->length = end - last->offset;
      ++last->count;
    } else {
      ranges.push_back(ReadRange{q.file, start, end - start, missing.size(), 1});
    }
    missing.push_back(u);
  }
  const auto fail = [&](const ReadRange& rr, int64_t bad, std::string why) {
    failure->bad = bad;
    failure->file = rr.file;
    failure->offset = rr.offset;
    failure->length = rr.length;
    failure->first_block = unique_[missing[rr.first]].block;
    failure->why = std::move(why);
    return false;
  };
  uint64_t blocks_read = 0, bytes_read = 0;
  struct Count {  // the reads done count, however the chunk returns
    std::atomic<uint64_t>* blocks;
    std::atomic<uint64_t>* bytes;
    const uint64_t* nblocks;
    const uint64_t* nbytes;
    ~Count() {
      blocks->fetch_add(*nblocks);
      bytes->fetch_add(*nbytes);
    }
  } count{&blocks_read_, &bytes_read_, &blocks_read, &bytes_read};
  for (const ReadRange& rr : ranges) {
    std::string why;
    const int64_t read = pread_all(fds_[rr.file], rr.offset, rr.length, buffer, &why);
    if (read != -1) return fail(rr, read, std::move(why));
    blocks_read += rr.count;
    bytes_read += rr.length;
    const RunBlockTable& table = *files_[rr.file];
    // The read's kept blocks go into the cache together (one lock per read); those opened
    // before a bad block are still cached.
    opened.clear();
    kept.clear();
    int64_t bad = -1;
    for (size_t k = 0; k < rr.count; ++k) {
      const size_t u = missing[rr.first + k];
      const int64_t number = unique_[u].block;
      if (!admit[u - ch.begin]) {
        const uint64_t raw = table.blocks[number].raw_length;
        if (scratch.size() < std::max<uint64_t>(raw, 1)) scratch.resize(std::max<uint64_t>(raw, 1));
        if (!open_table_block_into(table, number, buffer->data(), rr.length, rr.offset,
                                   scratch.data(), &why)) {
          bad = number;
          break;
        }
        search_into(ch, u, scratch.data(), raw);
        continue;
      }
      BlockRef b = open_table_block(table, number, buffer->data(), rr.length, rr.offset, &why);
      if (!b) {
        bad = number;
        break;
      }
      search_into(ch, u, b->bytes.get(), b->size);
      kept.push_back(number);
      opened.push_back(std::move(b));
    }
    ids.assign(opened.size(), table.file_id);
    cache_->put_many(ids.data(), kept.data(), opened.data(), opened.size());
    opened.clear();  // the cache holds what it took; the rest is freed here
    if (bad >= 0) return fail(rr, bad, std::move(why));
  }
  pins.clear();
  return true;
}

void LookupStep::search_into(Chunk& ch, size_t u, const uint8_t* bytes, size_t size) {
  const Unique& q = unique_[u];
  const PayloadView v = PayloadView::of(bytes, size, files_[q.file]->has_validity);
  for (size_t j = q.begin; j < q.end; ++j) {
    const int64_t k = entries_[j].key;
    const int64_t row = v.find(key_data_ + key_offsets_[k],
                               static_cast<size_t>(key_offsets_[k + 1] - key_offsets_[k]));
    rows_[j] = row;
    if (row >= 0 && v.has_value(row)) {
      const uint32_t a = v.value_offset(row);
      const uint32_t vsize = v.value_offset(row + 1) - a;
      at_[j] = static_cast<uint32_t>(ch.values.size());
      sizes_[j] = static_cast<int32_t>(vsize);
      ch.values.insert(ch.values.end(), v.value_data + a, v.value_data + a + vsize);
    }
  }
}

uint64_t LookupStep::value_bytes() const {
  uint64_t n = 0;
  for (const Chunk& ch : chunks_) n += ch.values.size();
  return n;
}

int64_t LookupStep::gather_step(int64_t* keys, int64_t* rows, int32_t* out_offsets,
                                uint8_t* out_data, uint8_t* out_validity) const {
  int64_t nulls = 0;
  int64_t at = 0;
  out_offsets[0] = 0;
  for (const Chunk& ch : chunks_) {
    if (ch.begin == ch.end) continue;
    for (size_t i = unique_[ch.begin].begin; i < unique_[ch.end - 1].end; ++i) {
      keys[i] = entries_[i].key;
      rows[i] = rows_[i];
      if (sizes_[i] >= 0) {
        if (sizes_[i]) std::memcpy(out_data + at, ch.values.data() + at_[i], sizes_[i]);
        at += sizes_[i];
        out_validity[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
      } else {
        ++nulls;
      }
      out_offsets[i + 1] = static_cast<int32_t>(at);
    }
  }
  return nulls;
}

size_t LookupStep::round_searched_on_open(size_t slot) const {
  size_t n = 0;
  for (uint8_t b : rounds_[slot].searched) n += b;
  return n;
}

uint64_t LookupStep::search(const int32_t* key_offsets, const uint8_t* key_data, int64_t* rows,
                            size_t slot) {
  Round& rd = rounds_[slot];
  for (size_t u = rd.begin; u < rd.end; ++u)
    if (!rd.searched[u - rd.begin]) search_block(rd, u, key_offsets, key_data);
  uint64_t total = 0;
  for (size_t i = 0; i < rd.found.size(); ++i) {
    rows[i] = rd.found[i].row;
    total += rd.found[i].size;
  }
  return total;
}

int64_t LookupStep::gather(int32_t* out_offsets, uint8_t* out_data, uint8_t* out_validity,
                           size_t slot) const {
  const Round& rd = rounds_[slot];
  int64_t nulls = 0;
  int64_t at = 0;
  out_offsets[0] = 0;
  for (size_t i = 0; i < rd.found.size(); ++i) {
    const Found& f = rd.found[i];
    if (f.value != nullptr) {  // found, not a tombstone
      if (f.size) std::memcpy(out_data + at, f.value, f.size);
      at += f.size;
      out_validity[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
    } else {
      ++nulls;
    }
    out_offsets[i + 1] = static_cast<int32_t>(at);
  }
  return nulls;
}

}  // namespace statecore
