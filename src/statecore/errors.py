"""Exceptions raised by statecore. Every error a user can cause derives from :class:`StateError`."""


class StateError(Exception):
    """Base class of every statecore error."""


class InvalidInputError(StateError, ValueError):
    """Bad input to a state call: wrong Arrow type, null keys, mismatched lengths, out-of-range key
    group. Raised before any state is modified."""


class StateMigrationError(StateError):
    """A state descriptor does not match the state restored under the same name (kind, key type,
    namespace type or value type differ), as Flink's StateMigrationException."""


class CheckpointError(StateError):
    """Base class of checkpoint errors."""


class CheckpointNotFoundError(CheckpointError, LookupError):
    """The requested checkpoint version (or the checkpoint directory) does not exist."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file is truncated, fails its xxhash64 checksum, cannot be decompressed, or is
    missing although a manifest references it. The message names the file."""


class CheckpointIOError(CheckpointError, OSError):
    """Reading a checkpoint file failed below the format: the filesystem or object store
    refused or dropped the request (network, permissions, a server error). The file may well
    be intact; retrying later can succeed. The message names the file. (A file whose bytes are
    wrong raises CorruptCheckpointError instead.)"""


class FencedError(CheckpointError):
    """Another driver took over the checkpoint root (its lease, statecore.checkpoint.lease):
    this store may no longer commit, compact or delete there. Nothing it published after the
    takeover stays; restart the driver (it then takes the lease back) or stop it."""


class ExternalStateError(StateError):
    """Base class of the errors of external keyed state (statecore.external): the store
    refused or failed a request, or an epoch cannot be committed as asked. Committed state is
    intact when one is raised: an epoch is applied by one atomic step or not at all."""


class ExternalStoreUnavailableError(ExternalStateError, OSError):
    """The external store could not be reached or did not answer in time (connection refused
    or reset, timeout). Nothing is known to have changed; retrying later can succeed."""


class ExternalStoreAuthError(ExternalStateError, PermissionError):
    """The external store refused the credentials (wrong password or user, no permission)."""


class EpochCommitError(ExternalStateError):
    """An epoch cannot be committed or pre-committed as asked: a write-ahead log named for the
    commit is missing or belongs to another epoch, or the epoch is not newer than the committed
    one. The message names the epoch and the log; the committed epoch is unchanged."""
