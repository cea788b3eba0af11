# cython: language_level=3, boundscheck=False, wraparound=False
"""statecore._native: the compiled bridge between Python and the C++ core (native/).

Thin wrappers, one area per included file: ``_native_types.pxi`` (statecore type names as native
specs), ``_native_bytes.pxi`` (byte order, varlen), ``_native_keys.pxi`` (hashes, key groups,
KeyEncoder), ``_native_arrow.pxi`` (Arrow in and out), ``_native_stored.pxi`` (stored values of
the per-record path), ``_native_runs.pxi`` (merge, TTL filter and checks of sorted runs),
``_native_table.pxi`` (NativeStateTable, NativeTableSnapshot), ``_native_blocks.pxi``
(checkpoint data-file blocks, SnapshotBlockSerializer) and ``_native_lookup.pxi`` (the run
lookups' block cache and batch steps). The C++ declarations are in
``_native_core.pxd``.

Errors: translated once, where the C++ functions are declared (``raise_native_error`` in
_native_core.pxd): std::invalid_argument (BatchError among them) and std::out_of_range become
:class:`statecore.errors.InvalidInputError`; other C++ exceptions map as Cython's ``except +``
maps them (std::bad_alloc -> MemoryError, ...).

GIL: batch kernels, bulk loads, merges, TTL passes, hashing of buffers and block codecs run with
the GIL released. Batch kernels read Arrow arrays through the Arrow C Data Interface
(``__arrow_c_array__`` PyCapsules, zero copy).

Thread contract: a StateTable is owned by one Python thread at a time (the task's). Snapshots may
be read from another thread. Calls without the GIL mark their table busy; another thread's call
on it raises StateError meanwhile (NativeStateTable). Kernels on different tables share no
mutable state and may run in parallel.
"""
from cpython.buffer cimport PyBUF_WRITABLE
from cython.operator cimport dereference as deref
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.pycapsule cimport PyCapsule_GetPointer
from cpython.unicode cimport PyUnicode_AsUTF8String, PyUnicode_DecodeUTF8
from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t, uint64_t
from libc.string cimport memchr, memcmp, memcpy
from libcpp.memory cimport shared_ptr
from libcpp.pair cimport pair
from libcpp.string cimport string
from libcpp.vector cimport vector

from concurrent.futures import CancelledError

import numpy as np
import pyarrow as pa

from statecore import key_types as KT
from statecore import value_types as VT
from statecore.buffer_pool import take
from statecore.errors import InvalidInputError, StateError

cimport _native_core as c

# C++ exceptions of the core raise InvalidInputError for bad input (see raise_native_error).
c.set_invalid_input_error(InvalidInputError)

include "_native_types.pxi"
include "_native_bytes.pxi"
include "_native_keys.pxi"
include "_native_arrow.pxi"
include "_native_stored.pxi"
include "_native_runs.pxi"
include "_native_table.pxi"
include "_native_blocks.pxi"
include "_native_lookup.pxi"

_check_cpu_request()
