# Declarations of the native core (native/include/statecore/*.h) for Cython, in the style of
# pyarrow's includes: C++ declarations here, thin wrappers in _native.pyx and its .pxi files.
#
# Every function that can throw is declared ``except +raise_native_error``: a C++ exception
# becomes a Python exception in that one place (as pyarrow's check_status turns a Status into
# one), also when the call runs without the GIL, and the wrappers need no try/except of their own.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.memory cimport shared_ptr
from libcpp.pair cimport pair
from libcpp.string cimport string
from libcpp.vector cimport vector


cdef extern from *:
    """
    #include <ios>
    #include <new>
    #include <stdexcept>
    #include <typeinfo>
    // statecore.errors.InvalidInputError, set once when the module is imported.
    static PyObject* statecore_invalid_input_error = NULL;
    static void statecore_set_invalid_input_error(PyObject* cls) {
      Py_XINCREF(cls);
      Py_XSETREF(statecore_invalid_input_error, cls);
    }
    // The C++ -> Python error translation of every native call, run by Cython inside its catch
    // block with the GIL held. The core reports bad input as std::invalid_argument (BatchError
    // derives from it) or std::out_of_range (a key group outside a table):
    // InvalidInputError. Every other exception maps as Cython's default ``except +raise_native_error`` maps it.
    static void statecore_raise_native_error() {
      try {
        if (PyErr_Occurred())
          ;  // a Python exception is already set: it wins, as in Cython's default handler
        else
          throw;
      } catch (const std::invalid_argument& e) {
        PyErr_SetString(statecore_invalid_input_error ? statecore_invalid_input_error
                                                      : PyExc_ValueError, e.what());
      } catch (const std::out_of_range& e) {
        PyErr_SetString(statecore_invalid_input_error ? statecore_invalid_input_error
                                                      : PyExc_IndexError, e.what());
      } catch (const std::bad_alloc& e) {
        PyErr_SetString(PyExc_MemoryError, e.what());
      } catch (const std::bad_cast& e) {
        PyErr_SetString(PyExc_TypeError, e.what());
      } catch (const std::bad_typeid& e) {
        PyErr_SetString(PyExc_TypeError, e.what());
      } catch (const std::domain_error& e) {
        PyErr_SetString(PyExc_ValueError, e.what());
      } catch (const std::ios_base::failure& e) {
        PyErr_SetString(PyExc_IOError, e.what());
      } catch (const std::overflow_error& e) {
        PyErr_SetString(PyExc_OverflowError, e.what());
      } catch (const std::range_error& e) {
        PyErr_SetString(PyExc_ArithmeticError, e.what());
      } catch (const std::underflow_error& e) {
        PyErr_SetString(PyExc_ArithmeticError, e.what());
      } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
      } catch (...) {
        PyErr_SetString(PyExc_RuntimeError, "Unknown exception");
      }
    }
    """
    void set_invalid_input_error "statecore_set_invalid_input_error"(object cls)
    void raise_native_error "statecore_raise_native_error"()


cdef extern from "statecore/arrow_abi.h":
    struct ArrowSchema:
        const char* format
        void (*release)(ArrowSchema*)

    struct ArrowArray:
        int64_t length
        int64_t null_count
        int64_t offset
        void (*release)(ArrowArray*)


cdef extern from "statecore/hash.h" namespace "statecore" nogil:
    uint64_t xxh64(const void* data, size_t size, uint64_t seed)
    uint32_t murmur3_32(const void* data, size_t size, uint32_t seed)
    int32_t flink_murmur_hash(int32_t code)


cdef extern from "statecore/cpu_dispatch.h" namespace "statecore::cpu" nogil:
    cdef enum class Level(int):
        kBaseline
        kV3
        kV4

    cdef cppclass Dispatch:
        Level level
        Level detected
        bint request_valid

    const Dispatch& dispatch()
    const char* level_name(Level level)


cdef extern from "statecore/key_groups.h" namespace "statecore" nogil:
    cdef enum class Assigner(uint8_t):
        Spark
        Flink

    cdef enum class KeyType(uint8_t):
        Int32
        Int64
        String
        Binary
        UInt64
        Float64
        Bool
        Timestamp
        FixedSizeBinary

    cdef enum class TimeUnit(uint8_t):
        Second
        Milli
        Micro
        Nano

    cdef cppclass KeyColumn:
        KeyType type
        int32_t width
        TimeUnit unit

    cdef cppclass KeyHasher:
        KeyHasher(Assigner a)
        void add_int32(int32_t v)
        void add_int64(int64_t v)
        void add_uint64(uint64_t v)
        void add_float64(double v)
        void add_bool(cbool v)
        void add_string(const char* utf8, size_t size) except +raise_native_error
        void add_binary(const void* data, size_t size)
        int32_t key_group(int32_t max_parallelism) except +raise_native_error

    cdef cppclass KeyGroupRange:
        int32_t start
        int32_t end

    int32_t key_group_for_int32(Assigner a, int32_t key, int32_t max_parallelism) except +raise_native_error
    int32_t key_group_for_int64(Assigner a, int64_t key, int32_t max_parallelism) except +raise_native_error
    int32_t key_group_for_string(Assigner a, const char* utf8, size_t size, int32_t max_parallelism) except +raise_native_error
    int32_t key_group_for_binary(Assigner a, const void* data, size_t size, int32_t max_parallelism) except +raise_native_error
    int32_t key_group_for_uint64(Assigner a, uint64_t key, int32_t max_parallelism) except +raise_native_error
    int32_t key_group_for_float64(Assigner a, double key, int32_t max_parallelism) except +raise_native_error
    int32_t key_group_for_bool(Assigner a, cbool key, int32_t max_parallelism) except +raise_native_error


cdef extern from "statecore/key_codec.h" namespace "statecore" nogil:
    cdef cppclass KeySchema:
        vector[KeyColumn] columns
        cbool is_struct
    int32_t default_max_parallelism(int32_t parallelism) except +raise_native_error
    KeyGroupRange key_group_range_for_operator(int32_t max_parallelism, int32_t parallelism,
                                               int32_t operator_index) except +raise_native_error
    int32_t operator_index_for_key_group(int32_t max_parallelism, int32_t parallelism,
                                         int32_t key_group) except +raise_native_error


cdef extern from "statecore/sorted_run.h" namespace "statecore" nogil:
    cdef cppclass ByteView:
        const uint8_t* data
        size_t size

    cdef cppclass SortedRun:
        vector[uint8_t] key_data
        vector[uint64_t] key_offsets
        vector[uint8_t] value_data
        vector[uint64_t] value_offsets
        vector[uint8_t] valid
        size_t size()

    cdef cppclass ArrowBinaryRun:
        const int32_t* key_offsets
        const uint8_t* key_data
        size_t key_data_size
        const int32_t* value_offsets
        const uint8_t* value_data
        size_t value_data_size
        const uint8_t* validity
        int64_t validity_bit
        size_t size

    cdef cppclass RunPick:
        uint32_t run
        uint32_t row

    void merge_newest_wins(const vector[ArrowBinaryRun]& runs, vector[RunPick]* out,
                           cbool keep_tombstones) except +raise_native_error
    int64_t first_bad_offset(const int32_t* o, size_t n, size_t data_size)


cdef extern from *:
    """
    #include "statecore/detail/utf8.h"
    // detail::utf8_check with its enum as an int (Cython declares no scoped enum by value here).
    static inline int statecore_utf8_check(const uint8_t* p, size_t n, size_t* at) {
      return static_cast<int>(statecore::detail::utf8_check(p, n, at));
    }
    static inline const char* statecore_utf8_error_name(int err) {
      return statecore::detail::utf8_error_name(static_cast<statecore::detail::Utf8Error>(err));
    }
    """
    int utf8_check "statecore_utf8_check"(const uint8_t* p, size_t n, size_t* at) nogil
    const char* utf8_error_name "statecore_utf8_error_name"(int err) nogil


cdef extern from "statecore/bulk_load.h" namespace "statecore" nogil:
    string check_entries(const ArrowBinaryRun& run, int32_t kg_lo, int32_t kg_hi,
                         int prefix_bytes, int64_t value_width, cbool tombstones) except +raise_native_error
    void load_entries(StateTable& table, const ArrowBinaryRun& run, int prefix_bytes) except +raise_native_error


cdef extern from "statecore/state_map.h" namespace "statecore" nogil:
    cdef cppclass MapStats "statecore::StateMap::Stats":
        uint64_t entry_copies
        uint64_t page_copies
        uint64_t directory_copies

    cdef cppclass StateMap:
        size_t size()
        size_t bytes()
        cbool get(const uint8_t* key, size_t key_size, ByteView* out) except +raise_native_error
        uint8_t* put(const uint8_t* key, size_t key_size, size_t value_size) except +raise_native_error
        uint32_t hash(const uint8_t* key, size_t key_size)
        void prefetch_bucket(uint32_t hash)
        uint8_t* upsert(uint32_t hash, const uint8_t* key, size_t key_size, size_t new_value_size,
                        size_t* value_size, cbool* inserted) except +raise_native_error
        cbool remove(const uint8_t* key, size_t key_size) except +raise_native_error
        void clear() except +raise_native_error
        void reserve(size_t entries) except +raise_native_error
        cbool is_rehashing()
        size_t capacity()
        size_t retired_entries()
        void reclaim()
        MapStats stats()
        uint64_t version()
        uint64_t base_version()
        cbool insert_clean(const uint8_t* key, size_t key_size, const uint8_t* value,
                           size_t value_size) except +raise_native_error
        cbool is_clean(const uint8_t* key, size_t key_size) except +raise_native_error
        cbool evict(const uint8_t* key, size_t key_size) except +raise_native_error

    cdef cppclass MapSnapshot:
        void release()
        size_t size()
        SortedRun sorted_entries() except +raise_native_error
        SortedRun sorted_changes(uint64_t base) except +raise_native_error
        uint64_t version()
        uint64_t base_version()


cdef extern from "statecore/state_table.h" namespace "statecore" nogil:
    cdef cppclass TableSnapshot:
        TableSnapshot(const TableSnapshot&)
        int32_t kg_start()
        int32_t kg_end()
        const shared_ptr[MapSnapshot]& map(int32_t kg) except +raise_native_error
        size_t size()
        void release()
        uint64_t version()
        uint64_t base_version()

    cdef cppclass StateTable:
        StateTable(int32_t kg_start, int32_t kg_end) except +raise_native_error
        int32_t kg_start()
        int32_t kg_end()
        StateMap& map(int32_t kg) except +raise_native_error
        size_t size()
        size_t bytes()
        TableSnapshot snapshot() except +raise_native_error
        uint64_t version()
        uint64_t base_version()
        void mark_base(uint64_t version) except +raise_native_error
        uint64_t rebase(bint applied_changes) except +raise_native_error
        size_t removal_log_size()
        size_t evict_clean(size_t target_bytes) except +raise_native_error


cdef extern from "statecore/ttl.h" namespace "statecore::ttl" nogil:
    cdef cppclass IncrementalCleanup  # defined with the other ttl.h declarations below


cdef extern from "statecore/batch.h" namespace "statecore" nogil:
    cdef enum class ValueType(uint8_t):
        Int64
        Float64
        String
        Binary
        Int32
        Bool
        UInt64
        Timestamp
        FixedSizeBinary

    cdef cppclass ValueSpec:
        ValueType type
        char unit
        int32_t width

    cdef enum class BatchOp(uint8_t):
        Get
        Put
        Add

    cdef enum class Reducer(uint8_t):
        Sum
        Min
        Max
        Count
        First
        Last

    cdef cppclass BatchKeySpec:
        KeySchema key
        Assigner assigner
        int32_t max_parallelism
        int32_t kg_start
        int32_t kg_end
        cbool has_namespace
        KeySchema ns

    cdef cppclass ArrowInput:
        const ArrowSchema* schema
        const ArrowArray* array

    cdef cppclass TtlBatchSpec:
        cbool enabled
        int64_t ttl_ms
        int64_t now
        cbool update_on_read
        cbool return_expired
        IncrementalCleanup* cleanup

    void get_batch_fixed(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                         const ValueSpec& value_type, void* out_values, uint8_t* out_valid,
                         const TtlBatchSpec& ttl, int64_t* expired) except +raise_native_error
    void get_batch_var(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                       const ValueSpec& value_type, vector[int64_t]& offsets, vector[uint8_t]& data,
                       uint8_t* out_valid, const TtlBatchSpec& ttl, int64_t* expired) except +raise_native_error
    void put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   const ValueSpec& value_type, ArrowInput values, const TtlBatchSpec& ttl) except +raise_native_error
    void add_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   const ValueSpec& value_type, Reducer reducer, ArrowInput values,
                   void* out_values, uint8_t* out_valid, const TtlBatchSpec& ttl,
                   int64_t* expired) except +raise_native_error
    size_t value_width(const ValueSpec& t)
    void validate_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                        const ValueSpec& value_type, BatchOp op, Reducer reducer, ArrowInput values,
                        const TtlBatchSpec& ttl) except +raise_native_error


cdef extern from "statecore/key_codec.h" namespace "statecore" nogil:
    cdef enum class NamespaceType(uint8_t):
        Void
        Int64
        String
        Int32
        Binary
    size_t encoded_prefix_size(const uint8_t* key, size_t size, const KeySchema& key_schema,
                               NamespaceType namespace_type, int32_t max_parallelism) except +raise_native_error
    string serialized_key_problem(const uint8_t* data, size_t size,
                                  const KeySchema& schema) except +raise_native_error
    int32_t read_key_group_prefix(const uint8_t* key, size_t size,
                                  int32_t max_parallelism) except +raise_native_error


cdef extern from "statecore/collection_index.h" namespace "statecore" nogil:
    cdef cppclass CollectionIndex:
        CollectionIndex(int32_t kg_start, int32_t kg_end) except +raise_native_error
        cbool insert(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
                     size_t member_size) except +raise_native_error
        cbool erase(int32_t kg, const uint8_t* prefix, size_t prefix_size, const uint8_t* member,
                    size_t member_size) except +raise_native_error
        cbool contains(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                       const uint8_t* member, size_t member_size) except +raise_native_error
        size_t size(int32_t kg, const uint8_t* prefix, size_t prefix_size) except +raise_native_error
        vector[string] take(int32_t kg, const uint8_t* prefix, size_t prefix_size) except +raise_native_error
        vector[string] list_members "members"(int32_t kg, const uint8_t* prefix, size_t prefix_size) except +raise_native_error
        void clear()
        void insert_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                               const KeySchema& key, NamespaceType namespace_type,
                               int32_t max_parallelism) except +raise_native_error
        void erase_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                              const KeySchema& key, NamespaceType namespace_type,
                              int32_t max_parallelism) except +raise_native_error
        void erase_entry_key_strings "erase_entry_keys"(
            const vector[string]& keys, const KeySchema& key, NamespaceType namespace_type,
            int32_t max_parallelism) except +raise_native_error
        size_t prune(StateTable& table) except +raise_native_error
        size_t collections()
        size_t members()
        size_t bytes()


cdef extern from "statecore/list_index.h" namespace "statecore" nogil:
    cdef cppclass ListIndex:
        ListIndex(int32_t kg_start, int32_t kg_end) except +raise_native_error
        cbool last(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                   uint64_t* last) except +raise_native_error
        cbool insert(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                     uint64_t seq) except +raise_native_error
        cbool erase(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                    uint64_t seq) except +raise_native_error
        size_t size(int32_t kg, const uint8_t* prefix, size_t prefix_size) except +raise_native_error
        vector[uint64_t] seqs(int32_t kg, const uint8_t* prefix, size_t prefix_size) except +raise_native_error
        void chunks(int32_t kg, const uint8_t* prefix, size_t prefix_size,
                    vector[uint64_t]& out) except +raise_native_error
        vector[uint64_t] take(int32_t kg, const uint8_t* prefix, size_t prefix_size) except +raise_native_error
        void clear()
        void insert_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                               int prefix_width) except +raise_native_error
        void erase_entry_keys(const uint8_t* data, const int32_t* off, int64_t n,
                              int prefix_width) except +raise_native_error
        void erase_entry_key_strings "erase_entry_keys"(
            const vector[string]& keys, int prefix_width) except +raise_native_error
        size_t prune(StateTable& table) except +raise_native_error
        size_t lists()
        size_t chunks()
        size_t bytes()
    void store_list_seq(uint8_t* out, uint64_t seq)
    uint64_t load_list_seq(const uint8_t* p)


cdef extern from "statecore/list_chunks.h" namespace "statecore" nogil:
    size_t kListChunkElements
    size_t list_chunk_count(const uint8_t* value, size_t size, size_t width,
                            size_t suffix) except +raise_native_error
    void list_append_encoded(StateMap& m, ListIndex& index, int32_t kg, const uint8_t* prefix,
                             size_t prefix_size, const uint8_t* data, const size_t* ends,
                             size_t n, size_t width, size_t suffix,
                             vector[uint8_t]& key) except +raise_native_error


cdef extern from "statecore/batch_collections.h" namespace "statecore" nogil:
    void list_append_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                           const ValueSpec& element_type, ArrowInput values,
                           const TtlBatchSpec& ttl, ListIndex* index) except +raise_native_error
    void validate_list_append_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                                    const ValueSpec& element_type, ArrowInput values,
                                    const TtlBatchSpec& ttl) except +raise_native_error
    void map_put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                       const KeySchema& user_key, ArrowInput user_keys, const ValueSpec& value_type,
                       ArrowInput values, const TtlBatchSpec& ttl,
                       CollectionIndex* index) except +raise_native_error
    void validate_map_put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                                const KeySchema& user_key, ArrowInput user_keys,
                                const ValueSpec& value_type, ArrowInput values,
                                const TtlBatchSpec& ttl) except +raise_native_error


cdef extern from "statecore/tiered_batch.h" namespace "statecore" nogil:
    void batch_encoded_keys(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                            const uint8_t* rows, cbool only_absent, vector[int32_t]* offsets,
                            vector[uint8_t]* data) except +raise_native_error
    size_t load_clean_batch(StateTable& table, const int32_t* kgs, const int32_t* key_offsets,
                            const uint8_t* key_data, const int32_t* value_offsets,
                            const uint8_t* value_data, const uint8_t* validity,
                            int64_t validity_offset, size_t n) except +raise_native_error


cdef extern from "statecore/batch_reads.h" namespace "statecore" nogil:
    cdef cppclass MapGetOutput:
        MapGetOutput()
        void* fixed
        vector[int64_t]* offsets
        vector[uint8_t]* data
        uint8_t* valid
    void clear_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                     CollectionIndex* index, ListIndex* list_index,
                     IncrementalCleanup* cleanup) except +raise_native_error
    void list_get_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                        const ValueSpec& element_type, vector[int64_t]& list_offsets,
                        vector[uint8_t]& elements, vector[int64_t]& element_offsets,
                        const TtlBatchSpec& ttl, int64_t* expired,
                        ListIndex* index) except +raise_native_error
    void map_get_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                       const KeySchema& user_key, ArrowInput user_keys,
                       const ValueSpec& value_type, const MapGetOutput& out,
                       const TtlBatchSpec& ttl, int64_t* expired,
                       CollectionIndex* index) except +raise_native_error
    void map_contains_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                            const KeySchema& user_key, ArrowInput user_keys,
                            const ValueSpec& value_type, uint8_t* found,
                            const TtlBatchSpec& ttl, int64_t* expired,
                            CollectionIndex* index) except +raise_native_error
    void map_remove_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                          const KeySchema& user_key, ArrowInput user_keys,
                          CollectionIndex* index,
                          IncrementalCleanup* cleanup) except +raise_native_error
    void validate_key_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                            const TtlBatchSpec& ttl) except +raise_native_error
    void validate_map_key_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                                const KeySchema& user_key, ArrowInput user_keys,
                                const TtlBatchSpec& ttl) except +raise_native_error


cdef extern from *:
    """
    #include "statecore/state_table.h"
    // TableSnapshot has no default constructor, which Cython temporaries need: build it on the heap.
    static statecore::TableSnapshot* statecore_new_table_snapshot(statecore::StateTable& t) {
      return new statecore::TableSnapshot(t.snapshot());
    }
    """
    TableSnapshot* new_table_snapshot "statecore_new_table_snapshot"(StateTable& t) except +raise_native_error


cdef extern from "statecore/ttl.h" namespace "statecore::ttl" nogil:
    cdef enum class Layout(uint8_t):
        Value
        List

    cdef cppclass FilterSpec:
        Layout layout
        uint32_t fixed_width
        int64_t ttl_ms

    cdef cppclass CleanupStep:
        size_t visited
        size_t expired
        cbool wrapped

    cdef cppclass TableCursor:
        int32_t key_group
        uint64_t bucket

    cdef cppclass IncrementalCleanup:
        StateTable* table
        TableCursor cursor
        size_t cleanup_size
        size_t steps_per_row
        FilterSpec spec
        int64_t now
        CollectionIndex* index
        KeySchema index_key
        NamespaceType index_namespace
        int32_t index_max_parallelism
        ListIndex* list_index
        int list_prefix_width
        size_t expired
        size_t visited

    cdef cppclass MigrationSpec:
        Layout layout
        uint32_t fixed_width
        cbool add_timestamps
        int64_t ts
        int64_t ttl_ms
        int64_t now

    cdef cppclass MigrationResult:
        size_t rewritten
        size_t removed
        size_t expired

    cdef cppclass ValuesFiltered:
        size_t kept
        size_t data_bytes
        size_t expired

    ValuesFiltered filter_values(const FilterSpec& spec, int64_t now, const uint8_t* data,
                                 size_t data_size, const int32_t* offsets, size_t n,
                                 uint8_t* keep, int32_t* out_offsets, uint8_t* out_data) except +raise_native_error
    ValuesFiltered filter_values(const FilterSpec& spec, int64_t now, const uint8_t* data,
                                 size_t data_size, const int64_t* offsets, size_t n,
                                 uint8_t* keep, int64_t* out_offsets, uint8_t* out_data) except +raise_native_error

    MigrationResult migrate(StateTable& table, const MigrationSpec& spec) except +raise_native_error

    CleanupStep cleanup_table_step "statecore::ttl::cleanup_step"(
        StateTable& table, TableCursor* cursor, size_t min_entries, const FilterSpec& spec,
        int64_t now, SortedRun* scratch, vector[string]* removed) except +raise_native_error
    size_t restamp(StateMap& map, const FilterSpec& spec, int64_t ts_from, int64_t ts_to) except +raise_native_error
    size_t filter_run(const FilterSpec& spec, int64_t now, const SortedRun& src,
                      SortedRun& out) except +raise_native_error
    CleanupStep cleanup_step(StateMap& map, uint64_t* cursor, size_t min_entries,
                             const FilterSpec& spec, int64_t now, SortedRun* scratch,
                             vector[string]* removed) except +raise_native_error


cdef extern from "statecore/block_codec.h" namespace "statecore" nogil:
    size_t lz4_block_compress(const uint8_t* src, size_t n, vector[uint8_t]* out) except +raise_native_error
    size_t lz4_block_bound(size_t n)
    void bloom_filter_build(const int32_t* offsets, const uint8_t* data, size_t n,
                            uint32_t bits_per_key, vector[uint8_t]* out) except +raise_native_error
    void bloom_probe_many(const uint8_t* filter, size_t nbytes, uint32_t k, const uint64_t* hashes,
                          size_t n, uint8_t* out)

    cdef cppclass StoredBlockRef:
        uint64_t offset
        uint64_t stored_length
        uint64_t raw_length
        uint64_t entries
        uint64_t xxh64
        uint32_t codec

    cdef cppclass DecodeBuffers:
        int32_t* key_offsets
        int32_t* value_offsets
        uint8_t* key_data
        uint8_t* value_data
        size_t data_capacity
        uint8_t* validity

    cdef cppclass DecodeResult:
        int64_t failed_block
        string error
        size_t key_bytes
        size_t value_bytes
        uint64_t tombstones

    DecodeResult decode_blocks(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                               size_t count, cbool has_validity,
                               const DecodeBuffers& out) except +raise_native_error

    cdef cppclass VerifyResult:
        int64_t failed_block
        string error
        uint64_t raw_bytes

    VerifyResult verify_blocks(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                               size_t count) except +raise_native_error


cdef extern from "statecore/payload_lookup.h" namespace "statecore" nogil:
    cdef cppclass PayloadView:
        uint32_t entries
        const uint8_t* value_data
        @staticmethod
        PayloadView of(const uint8_t* p, size_t size, cbool has_validity)
        int64_t find(const uint8_t* key, size_t key_size)
        cbool has_value(int64_t row)
        uint32_t value_offset(int64_t row)

    int64_t open_blocks_into(const uint8_t* data, size_t size, const StoredBlockRef* blocks,
                             size_t count, cbool has_validity, const uint8_t* const* last_keys,
                             const size_t* last_key_sizes, uint8_t* const* out,
                             string* why) except +raise_native_error


cdef extern from "statecore/block_cache.h" namespace "statecore" nogil:
    cdef cppclass OpenedBlock:
        uint8_t* bytes "bytes.get"()
        size_t size

    cdef cppclass BlockCacheStats:
        int64_t hits
        int64_t misses
        int64_t rejected
        uint64_t used_bytes
        size_t blocks

    cdef cppclass BlockCache:
        BlockCache(uint64_t budget_bytes) except +raise_native_error
        shared_ptr[const OpenedBlock] get(int64_t file, int64_t block) except +raise_native_error
        void put(int64_t file, int64_t block,
                 shared_ptr[const OpenedBlock] b) except +raise_native_error
        BlockCacheStats stats()
        uint64_t budget()
        void set_budget(uint64_t budget_bytes)
        void clear()
        void retain_files(const int64_t* files, size_t n) except +raise_native_error


cdef extern from "statecore/fetch_pool.h" namespace "statecore" nogil:
    cdef cppclass FetchPool:
        FetchPool(size_t threads) except +raise_native_error
        size_t threads()


cdef extern from "statecore/run_lookup.h" namespace "statecore" nogil:
    cdef cppclass RunBlockTable:
        int64_t file_id
        cbool has_validity
        const StoredBlockRef* blocks
        size_t block_count
        const int64_t* key_offsets
        const uint8_t* key_data

    shared_ptr[const OpenedBlock] open_table_block(
        const RunBlockTable& table, int64_t b, const uint8_t* data, size_t size, uint64_t base,
        string* why) except +raise_native_error

    cdef cppclass ReadRange:
        size_t file
        uint64_t offset
        uint64_t length
        size_t first
        size_t count

    cdef cppclass StepFailure:
        int64_t bad
        size_t file
        uint64_t offset
        uint64_t length
        int64_t first_block
        string why

    cdef cppclass StepCounts:
        uint64_t blocks_read
        uint64_t bytes_read
        uint64_t peak_open_bytes

    cdef cppclass LookupStep:
        LookupStep(BlockCache* cache, uint64_t open_bytes, uint64_t gap_bytes,
                   uint64_t max_read_bytes) except +raise_native_error
        void add(const RunBlockTable* table, const int64_t* keys, const int64_t* blocks,
                 size_t n) except +raise_native_error
        void set_keys(const int32_t* key_offsets, const uint8_t* key_data)
        cbool next_round(size_t slot) except +raise_native_error
        const vector[ReadRange]& ranges(size_t slot)
        const vector[pair[size_t, int64_t]]& missing(size_t slot)
        uint64_t round_bytes(size_t slot)
        size_t round_hits(size_t slot)
        size_t round_searched_on_open(size_t slot)
        int64_t open_range(size_t r, const uint8_t* data, size_t size, string* why,
                           size_t slot) except +raise_native_error
        int64_t read_open_ranges(const int* fds, size_t worker, size_t workers,
                                 size_t* range, string* why,
                                 size_t slot) except +raise_native_error
        void start_reads(FetchPool* pool, const int* fds, size_t nfds, size_t workers,
                         size_t slot) except +raise_native_error
        int64_t finish_reads(size_t* range, string* why, size_t slot) except +raise_native_error
        size_t round_key_count(size_t slot)
        int64_t round_key(size_t i, size_t slot)
        uint64_t search(const int32_t* key_offsets, const uint8_t* key_data, int64_t* rows,
                        size_t slot)
        int64_t gather(int32_t* out_offsets, uint8_t* out_data,
                       uint8_t* out_validity, size_t slot)
        cbool run(FetchPool* pool, const int* fds, size_t nfds, size_t workers,
                  StepFailure* failure) except +raise_native_error
        const StepCounts& counts()
        size_t key_count()
        uint64_t value_bytes()
        int64_t gather_step(int64_t* keys, int64_t* rows, int32_t* out_offsets,
                            uint8_t* out_data, uint8_t* out_validity)


cdef extern from "statecore/run_route.h" namespace "statecore" nogil:
    cdef cppclass RouteGroup:
        const uint8_t* filter
        size_t filter_bytes
        uint32_t hashes
        int64_t first_block
        int64_t block_count

    cdef cppclass RouteCounts:
        int64_t filter_negatives
        int64_t range_negatives

    cdef cppclass RouteKeys:
        const int32_t* offsets
        const uint8_t* data
        const int64_t* key_groups
        const uint64_t* hashes

    void route_to_blocks(const RouteGroup* groups, size_t group_count, int64_t kg_base,
                         const int64_t* block_key_offsets, const uint8_t* block_key_data,
                         const RouteKeys& keys, const int64_t* rows, size_t n, int64_t* out,
                         RouteCounts* counts)


cdef extern from "statecore/bulk_load.h" namespace "statecore" nogil:
    cdef cppclass BlockLoadSpec:
        int prefix_bytes
        int64_t key_width
        int64_t value_width
        cbool has_validity
        cbool into_empty
        cbool open_ahead

    cdef cppclass BlockLoadResult:
        int64_t failed_block
        cbool corrupt
        string error
        uint64_t entries

    BlockLoadResult load_blocks(StateTable& table, const uint8_t* data, size_t size,
                                const StoredBlockRef* blocks, const int32_t* key_groups,
                                size_t count, const BlockLoadSpec& spec) except +raise_native_error
    BlockLoadResult load_blocks_parallel(
        StateTable& table, const uint8_t* data, size_t size, const StoredBlockRef* blocks,
        const int32_t* key_groups, size_t count, const BlockLoadSpec& spec, int threads,
        uint64_t min_slice_bytes) except +raise_native_error


cdef extern from "statecore/snapshot_writer.h" namespace "statecore" nogil:
    cdef cppclass SerializerOptions:
        int32_t kg_start
        int32_t kg_end
        int prefix_bytes
        size_t block_target_bytes
        cbool incremental
        size_t queue_blocks
        cbool release_as_written
        uint32_t bloom_bits_per_key
        uint32_t codec
        int nice

    cdef cppclass BlockPayload:
        int32_t key_group
        uint32_t state
        uint32_t entries
        uint32_t tombstones
        cbool last_of_group
        vector[uint8_t] bytes

    cdef cppclass StoredBlock:
        int32_t key_group
        uint32_t state
        uint32_t entries
        uint32_t tombstones
        cbool last_of_group
        uint64_t offset
        uint64_t stored_length
        uint64_t raw_length
        uint64_t xxh64
        vector[uint8_t] last_key
        vector[uint8_t] filter

    cdef cppclass BlockChunk:
        vector[uint8_t] bytes
        vector[StoredBlock] blocks

    cdef cppclass SerializerSource:
        pass

    cdef cppclass SerializerStats "statecore::SnapshotSerializer::Stats":
        uint64_t blocks
        uint64_t payload_bytes
        uint64_t max_queued
        uint64_t producer_waits
        uint64_t ttl_expired

    cdef cppclass SnapshotSerializer:
        void start() except +raise_native_error
        void cancel()
        SerializerStats stats()


cdef extern from *:
    """
    #include <map>
    #include <string>
    #include "statecore/snapshot_writer.h"
    // Builders for the serializer's sources (Cython cannot easily fill structs holding
    // shared_ptr and std::map members) and a next() that reports cancellation as -1 instead of
    // an exception, so the wrapper can raise concurrent.futures.CancelledError.
    static std::vector<statecore::SerializerSource>* statecore_new_sources() {
      return new std::vector<statecore::SerializerSource>();
    }
    static void statecore_add_table_source(std::vector<statecore::SerializerSource>* v,
                                           const std::string& name,
                                           const statecore::TableSnapshot& t, bool changes,
                                           uint64_t base) {
      statecore::SerializerSource s;
      s.name = name;
      s.table = std::make_shared<statecore::TableSnapshot>(t);
      s.changes = changes;
      s.base = base;
      v->push_back(std::move(s));
    }
    static void statecore_set_source_ttl(std::vector<statecore::SerializerSource>* v,
                                         const statecore::ttl::FilterSpec& spec, int64_t now) {
      v->back().ttl_filter = true;
      v->back().ttl_spec = spec;
      v->back().ttl_now = now;
    }
    static statecore::SerializerSource* statecore_add_static_source(
        std::vector<statecore::SerializerSource>* v, const std::string& name) {
      statecore::SerializerSource s;
      s.name = name;
      v->push_back(std::move(s));
      return &v->back();
    }
    static statecore::SortedRun* statecore_static_group(statecore::SerializerSource* s,
                                                           int32_t kg) {
      return &s->fixed[kg];
    }
    static statecore::SnapshotSerializer* statecore_new_serializer(
        std::vector<statecore::SerializerSource>* v, const statecore::SerializerOptions& o) {
      return new statecore::SnapshotSerializer(std::move(*v), o);
    }
    static int statecore_serializer_next(statecore::SnapshotSerializer* s,
                                         statecore::BlockPayload* out) {
      try {
        return s->next(out) ? 1 : 0;
      } catch (const statecore::SerializerCancelled&) {
        return -1;
      }
    }
    static int statecore_serializer_next_chunk(statecore::SnapshotSerializer* s,
                                               statecore::BlockChunk* out, size_t target) {
      try {
        return s->next_chunk(out, target) ? 1 : 0;
      } catch (const statecore::SerializerCancelled&) {
        return -1;
      }
    }
    """
    vector[SerializerSource]* new_sources "statecore_new_sources"()
    void add_table_source "statecore_add_table_source"(
        vector[SerializerSource]* v, const string& name, const TableSnapshot& t, cbool changes,
        uint64_t base) except +raise_native_error
    void set_source_ttl "statecore_set_source_ttl"(
        vector[SerializerSource]* v, const FilterSpec& spec, int64_t now) except +raise_native_error
    SerializerSource* add_static_source "statecore_add_static_source"(
        vector[SerializerSource]* v, const string& name) except +raise_native_error
    SortedRun* static_group "statecore_static_group"(SerializerSource* s, int32_t kg) except +raise_native_error
    SnapshotSerializer* new_serializer "statecore_new_serializer"(
        vector[SerializerSource]* v, const SerializerOptions& o) except +raise_native_error
    int serializer_next "statecore_serializer_next"(SnapshotSerializer* s, BlockPayload* out) except +raise_native_error nogil
    int serializer_next_chunk "statecore_serializer_next_chunk"(
        SnapshotSerializer* s, BlockChunk* out, size_t target) except +raise_native_error nogil



cdef extern from "statecore/detail/page_pool.h" namespace "statecore::detail" nogil:
    cdef cppclass PagePrefault:
        PagePrefault(size_t nbytes) except +raise_native_error
        size_t chunks()
