# Declarations of the native core (native/include/statecore/*.h) for Cython, in the style of
# pyarrow's includes: C++ declarations here, thin wrappers in _native.pyx.
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libcpp cimport bool as cbool
from libcpp.memory cimport shared_ptr
from libcpp.pair cimport pair
from libcpp.vector cimport vector


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


cdef extern from "statecore/key_groups.h" namespace "statecore" nogil:
    cdef enum class Assigner(uint8_t):
        Spark
        Flink

    cdef enum class KeyType(uint8_t):
        Int32
        Int64
        String
        Binary

    cdef cppclass KeyGroupRange:
        int32_t start
        int32_t end

    int32_t key_group_for_int32(Assigner a, int32_t key, int32_t max_parallelism) except +
    int32_t key_group_for_int64(Assigner a, int64_t key, int32_t max_parallelism) except +
    int32_t key_group_for_string(Assigner a, const char* utf8, size_t size, int32_t max_parallelism) except +
    int32_t key_group_for_binary(Assigner a, const void* data, size_t size, int32_t max_parallelism) except +
    int32_t default_max_parallelism(int32_t parallelism) except +
    KeyGroupRange key_group_range_for_operator(int32_t max_parallelism, int32_t parallelism,
                                               int32_t operator_index) except +
    int32_t operator_index_for_key_group(int32_t max_parallelism, int32_t parallelism,
                                         int32_t key_group) except +


cdef extern from "statecore/state_map.h" namespace "statecore" nogil:
    cdef cppclass ByteView:
        const uint8_t* data
        size_t size

    cdef cppclass MapChange:
        ByteView key
        ByteView value
        cbool removed

    cdef cppclass MapStats "statecore::StateMap::Stats":
        uint64_t entry_copies
        uint64_t page_copies
        uint64_t directory_copies

    cdef cppclass StateMap:
        size_t size()
        size_t bytes()
        cbool get(const uint8_t* key, size_t key_size, ByteView* out) except +
        uint8_t* put(const uint8_t* key, size_t key_size, size_t value_size) except +
        cbool remove(const uint8_t* key, size_t key_size) except +
        void clear() except +
        cbool is_rehashing()
        size_t capacity()
        size_t retired_entries()
        MapStats stats()
        uint64_t version()
        uint64_t base_version()

    cdef cppclass MapSnapshot:
        void release()
        size_t size()
        vector[pair[ByteView, ByteView]] sorted_entries() except +
        vector[MapChange] sorted_changes(uint64_t base) except +
        uint64_t version()
        uint64_t base_version()


cdef extern from "statecore/state_table.h" namespace "statecore" nogil:
    cdef cppclass TableSnapshot:
        TableSnapshot(const TableSnapshot&)
        int32_t kg_start()
        int32_t kg_end()
        const shared_ptr[MapSnapshot]& map(int32_t kg) except +
        size_t size()
        void release()
        uint64_t version()
        uint64_t base_version()

    cdef cppclass StateTable:
        StateTable(int32_t kg_start, int32_t kg_end) except +
        int32_t kg_start()
        int32_t kg_end()
        StateMap& map(int32_t kg) except +
        size_t size()
        size_t bytes()
        TableSnapshot snapshot() except +
        uint64_t version()
        uint64_t base_version()
        void mark_base(uint64_t version) except +
        uint64_t rebase() except +
        size_t removal_log_size()


cdef extern from "statecore/batch.h" namespace "statecore" nogil:
    cdef enum class ValueType(uint8_t):
        Int64
        Float64
        String
        Binary

    cdef enum class Reducer(uint8_t):
        Sum
        Min
        Max
        Count

    cdef cppclass BatchKeySpec:
        KeyType kind
        Assigner assigner
        int32_t max_parallelism
        int32_t kg_start
        int32_t kg_end

    cdef cppclass ArrowInput:
        const ArrowSchema* schema
        const ArrowArray* array

    void get_batch_fixed(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                         ValueType value_type, void* out_values, uint8_t* out_valid) except +
    void get_batch_var(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                       ValueType value_type, vector[int64_t]& offsets, vector[uint8_t]& data,
                       uint8_t* out_valid) except +
    void put_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   ValueType value_type, ArrowInput values) except +
    void add_batch(StateTable& table, const BatchKeySpec& spec, ArrowInput keys,
                   ValueType value_type, Reducer reducer, ArrowInput values,
                   void* out_values, uint8_t* out_valid) except +


cdef extern from *:
    """
    #include "statecore/state_table.h"
    // TableSnapshot has no default constructor, which Cython temporaries need: build it on the heap.
    static statecore::TableSnapshot* statecore_new_table_snapshot(statecore::StateTable& t) {
      return new statecore::TableSnapshot(t.snapshot());
    }
    """
    TableSnapshot* new_table_snapshot "statecore_new_table_snapshot"(StateTable& t) except +
