"""The Redis side of external keyed state: key names, the connection, error mapping and the
Lua scripts that commit and abort epochs (layout: docs/formats.md "External state in Redis";
protocol: docs/external-state.md).

Every key of a state namespace ``NS`` starts with ``statecore:{NS}:``; the braces make ``NS``
the Redis Cluster hash tag, so all keys of a namespace live in one slot and one script may
touch them all. The keys:

* ``statecore:{NS}:meta`` -- hash: ``format`` (``"1"``), ``key_type``, ``max_parallelism``,
  ``assigner`` (fixed by the first backend opened on the namespace) and ``epoch`` (the
  committed epoch; absent before the first commit);
* ``statecore:{NS}:states`` -- hash: state name -> JSON state meta (as ``StateSnapshot``'s);
* ``statecore:{NS}:data:<kg>:<state>`` -- hash: encoded key -> stored value bytes, the
  committed entries of one state in one key group;
* ``statecore:{NS}:groups`` -- set of the data hash names ever written (for readers);
* ``statecore:{NS}:wal:<epoch>:<task>`` -- list: one task's pre-committed changes of one epoch;
* ``statecore:{NS}:pending`` -- set of the names of the logs present (added in the
  pre-commit's MULTI, removed by the commit and abort scripts), so that finding an epoch's
  logs costs O(logs pending) rather than a ``SCAN`` of the whole database.

The ``redis`` client (PyPI ``redis``, the ``redis`` extra) is imported on first use.
"""

from __future__ import annotations

import contextlib
import json
import os

from statecore.errors import (
    EpochCommitError,
    ExternalStateError,
    ExternalStoreAuthError,
    ExternalStoreUnavailableError,
    InvalidInputError,
    StateMigrationError,
)

__all__ = ["FORMAT", "WAL_MAGIC", "NamespaceKeys", "connect", "store_errors", "check_config",
           "commit_epoch", "abort_epoch", "wal_keys", "committed_epoch", "read_committed_epoch",
           "load_state_metas",
           "wal_header", "text_of"]

#: Version of the layout written to ``meta.format``.
FORMAT = "1"
#: First element of every write-ahead log, followed by a space and the epoch in decimal.
WAL_MAGIC = "statecore-wal/1"
#: Socket timeouts (s) of connections opened from a URL.
DEFAULT_TIMEOUT_S = 10.0
#: Marker of the errors the scripts raise themselves (mapped to EpochCommitError).
_SCRIPT_ERROR = "STATECORE_EPOCH"

# Applies every write-ahead log of an epoch, then records the epoch, in one script: Redis runs
# a script atomically (no other command runs meanwhile, and replication and the AOF see its
# effects as one MULTI/EXEC), so a reader or a crash sees the epoch either whole or not at all.
# Every log is checked before the first write; an epoch at or below the committed one changes
# nothing but the deletion of the logs named (a replayed pre-commit of a committed epoch).
_COMMIT_LUA = """
local epoch = ARGV[1]
local committed = redis.call('HGET', KEYS[1], 'epoch')
if committed and tonumber(epoch) <= tonumber(committed) then
  for i = 5, #KEYS do
    redis.call('DEL', KEYS[i])
    redis.call('SREM', KEYS[4], KEYS[i])
  end
  return {0, tonumber(committed)}
end
local magic = ARGV[3] .. ' ' .. epoch
for i = 5, #KEYS do
  local head = redis.call('LINDEX', KEYS[i], 0)
  if not head then
    return redis.error_reply(ARGV[4] .. ' epoch ' .. epoch .. ': write-ahead log ' .. KEYS[i]
      .. ' is missing (never pre-committed, aborted, or lost)')
  end
  if head ~= magic then
    return redis.error_reply(ARGV[4] .. ' epoch ' .. epoch .. ': write-ahead log ' .. KEYS[i]
      .. ' starts with ' .. string.sub(head, 1, 40) .. ', not ' .. magic)
  end
  if (redis.call('LLEN', KEYS[i]) - 1) % 4 ~= 0 then
    return redis.error_reply(ARGV[4] .. ' epoch ' .. epoch .. ': write-ahead log ' .. KEYS[i]
      .. ' is truncated')
  end
end
local applied = 0
for i = 5, #KEYS do
  local n = redis.call('LLEN', KEYS[i])
  local pos = 1
  while pos < n do
    local ops = redis.call('LRANGE', KEYS[i], pos, pos + 3999)
    for j = 1, #ops, 4 do
      local op = ops[j]
      if op == 'S' then
        local key = ARGV[2] .. ops[j + 1]
        redis.call('HSET', key, ops[j + 2], ops[j + 3])
        redis.call('SADD', KEYS[3], key)
      elseif op == 'D' then
        redis.call('HDEL', ARGV[2] .. ops[j + 1], ops[j + 2])
      elseif op == 'R' then
        redis.call('DEL', ARGV[2] .. ops[j + 1])
      elseif op == 'M' then
        redis.call('HSET', KEYS[2], ops[j + 1], ops[j + 2])
      elseif op == 'X' then
        -- TTL sweep of one hash, in the commit so that it is atomic with the epoch: delete the
        -- fields whose 8-byte big-endian timestamp suffix is at or below the cutoff, given as
        -- its signed high and unsigned low 32-bit halves (exact in Lua's doubles); never
        -- INT64_MIN (an event-time write before the first watermark, not stamped yet).
        local key = ARGV[2] .. ops[j + 1]
        local sp = string.find(ops[j + 2], ' ', 1, true)
        local chi = tonumber(string.sub(ops[j + 2], 1, sp - 1))
        local clo = tonumber(string.sub(ops[j + 2], sp + 1))
        local all = redis.call('HGETALL', key)
        for f = 1, #all, 2 do
          local v = all[f + 1]
          local n = #v
          if n >= 8 then
            local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(v, n - 7, n)
            local hi = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
            if hi >= 2147483648 then hi = hi - 4294967296 end
            local lo = ((b5 * 256 + b6) * 256 + b7) * 256 + b8
            if (hi < chi or (hi == chi and lo <= clo))
                and not (hi == -2147483648 and lo == 0) then
              redis.call('HDEL', key, all[f])
            end
          end
        end
      elseif op == 'L' then
        -- TTL sweep of one list state's hash: each chunk trimmed of its leading expired
        -- elements (statecore.ttl.filter_expired of a list), removed when none is left.
        -- ops[j + 3] is the element width without the suffix, 0 for varlen-prefixed
        -- elements; a chunk whose layout cannot be read stays as it is.
        local key = ARGV[2] .. ops[j + 1]
        local sp = string.find(ops[j + 2], ' ', 1, true)
        local chi = tonumber(string.sub(ops[j + 2], 1, sp - 1))
        local clo = tonumber(string.sub(ops[j + 2], sp + 1))
        local width = tonumber(ops[j + 3])
        local all = redis.call('HGETALL', key)
        for f = 1, #all, 2 do
          local v = all[f + 1]
          local len = #v
          local pos = 1
          local keep = nil
          local broken = false
          while pos <= len do
            local start = pos
            local n = width
            if width == 0 then
              n = 0
              local mul = 1
              while true do
                if pos > len or mul > 2 ^ 56 then broken = true break end
                local b = string.byte(v, pos)
                pos = pos + 1
                n = n + (b % 128) * mul
                if b < 128 then break end
                mul = mul * 128
              end
              if broken then break end
            end
            if pos + n + 7 > len then broken = true break end
            pos = pos + n + 8
            local b1, b2, b3, b4, b5, b6, b7, b8 = string.byte(v, pos - 8, pos - 1)
            local hi = ((b1 * 256 + b2) * 256 + b3) * 256 + b4
            if hi >= 2147483648 then hi = hi - 4294967296 end
            local lo = ((b5 * 256 + b6) * 256 + b7) * 256 + b8
            if (hi > chi or (hi == chi and lo > clo))
                or (hi == -2147483648 and lo == 0) then
              keep = start
              break
            end
          end
          if not broken then
            if keep == nil then
              redis.call('HDEL', key, all[f])
            elseif keep > 1 then
              redis.call('HSET', key, all[f], string.sub(v, keep))
            end
          end
        end
      end
      applied = applied + 1
    end
    pos = pos + #ops
  end
end
redis.call('HSET', KEYS[1], 'epoch', epoch)
for i = 5, #KEYS do
  redis.call('DEL', KEYS[i])
  redis.call('SREM', KEYS[4], KEYS[i])
end
return {1, applied}
"""

# Discards write-ahead logs of an epoch not committed (a committed epoch's logs are gone):
# those named, or without names every pending log of the epoch (ARGV[2], the names' prefix,
# matched in the pending set: never a scan of the database).
_ABORT_LUA = """
local committed = redis.call('HGET', KEYS[1], 'epoch')
if committed and tonumber(ARGV[1]) <= tonumber(committed) then return -1 end
local names = {}
if ARGV[2] ~= '' then
  local prefix = ARGV[2]
  for _, name in ipairs(redis.call('SMEMBERS', KEYS[2])) do
    if string.sub(name, 1, #prefix) == prefix then names[#names + 1] = name end
  end
else
  for i = 3, #KEYS do names[#names + 1] = KEYS[i] end
end
local n = 0
for _, name in ipairs(names) do
  n = n + redis.call('DEL', name)
  redis.call('SREM', KEYS[2], name)
end
return n
"""


def _redis():
    try:
        import redis
    except ImportError as e:  # pragma: no cover - the extra is installed wherever tests run
        raise InvalidInputError(
            "external state in Redis needs the redis client: pip install 'statecore[redis]'"
        ) from e
    return redis


def check_namespace(namespace) -> str:
    """``namespace`` checked: a non-empty str without ``{``, ``}`` (the Redis Cluster hash tag
    delimiters) or control characters. InvalidInputError otherwise."""
    if not isinstance(namespace, str) or not namespace:
        raise InvalidInputError(f"namespace must be a non-empty str, got {namespace!r}")
    bad = [c for c in namespace if c in "{}" or ord(c) < 32]
    if bad:
        raise InvalidInputError(f"namespace {namespace!r} contains {bad[0]!r}; braces and "
                                "control characters are not allowed")
    return namespace


class NamespaceKeys:
    """The Redis key names of state namespace ``namespace`` (module docstring)."""

    def __init__(self, namespace: str):
        self.namespace = check_namespace(namespace)
        self.prefix = f"statecore:{{{namespace}}}:"
        self.meta = self.prefix + "meta"
        self.states = self.prefix + "states"
        self.groups = self.prefix + "groups"
        #: Set of the names of the write-ahead logs present (pre-committed, not yet committed
        #: nor aborted).
        self.pending = self.prefix + "pending"
        #: Prefix of the data hashes; a hash's name is this plus :meth:`data_suffix`.
        self.data_prefix = self.prefix + "data:"

    @staticmethod
    def data_suffix(key_group: int, state: str) -> str:
        return f"{key_group}:{state}"

    def data(self, key_group: int, state: str) -> str:
        """Name of the hash of the committed entries of ``state`` in ``key_group``."""
        return self.data_prefix + self.data_suffix(key_group, state)

    def parse_data(self, name: str):
        """``(key group, state)`` of a data hash name, None for any other name."""
        if not name.startswith(self.data_prefix):
            return None
        kg, _, state = name[len(self.data_prefix):].partition(":")
        return (int(kg), state) if kg.isdigit() and state else None

    def wal(self, epoch: int, task: str) -> str:
        """Name of the write-ahead log of ``task`` for ``epoch``."""
        return f"{self.wal_prefix(epoch)}{task}"

    def wal_prefix(self, epoch: int) -> str:
        """The common start of the names of ``epoch``'s write-ahead logs."""
        return f"{self.prefix}wal:{int(epoch)}:"


def wal_header(epoch: int) -> str:
    """The first element of a write-ahead log of ``epoch``."""
    return f"{WAL_MAGIC} {int(epoch)}"


#: The environment variable a Redis URL is taken from when none is given (the convention of
#: hosted Redis services and most client frameworks).
REDIS_URL_ENV = "REDIS_URL"


def connect(url: str | None, timeout_s: float = DEFAULT_TIMEOUT_S):
    """A ``redis.Redis`` client for ``url`` (``redis://[user:password@]host:port/db``,
    ``rediss://`` for TLS, ``unix://``; None: the ``REDIS_URL`` environment variable),
    returning bytes, with connect and socket timeouts of ``timeout_s``. Connects lazily;
    InvalidInputError for a malformed URL, or for None when ``REDIS_URL`` is not set."""
    redis = _redis()
    if url is None:
        url = os.environ.get(REDIS_URL_ENV)
        if url is None:
            raise InvalidInputError(
                f"no Redis URL: pass url= (redis://host:port/db) or set {REDIS_URL_ENV}")
    if not isinstance(url, str):
        raise InvalidInputError(f"url must be a redis:// URL string, got {url!r}")
    try:
        return redis.Redis.from_url(url, socket_timeout=timeout_s,
                                    socket_connect_timeout=timeout_s)
    except ValueError as e:
        raise InvalidInputError(f"bad Redis URL: {e}") from e


def _where(client) -> str:
    kw = getattr(getattr(client, "connection_pool", None), "connection_kwargs", {})
    if "path" in kw:
        return f"unix:{kw['path']}"
    return f"{kw.get('host', '?')}:{kw.get('port', '?')}"


@contextlib.contextmanager
def store_errors(client, what: str):
    """Map the redis client's exceptions raised inside the block to statecore errors naming
    ``what`` was being done and the server (never its password): unreachable or timed out ->
    ExternalStoreUnavailableError, credentials refused -> ExternalStoreAuthError, a script's
    own refusal -> EpochCommitError, anything else -> ExternalStateError."""
    redis = _redis()
    ex = redis.exceptions
    try:
        yield
    except tuple(getattr(ex, n) for n in ("AuthenticationError", "AuthorizationError",
                                          "NoPermissionError") if hasattr(ex, n)) as e:
        raise ExternalStoreAuthError(f"{what}: Redis at {_where(client)} refused the "
                                     f"credentials: {e}") from e
    except (ex.ConnectionError, ex.TimeoutError) as e:
        raise ExternalStoreUnavailableError(f"{what}: Redis at {_where(client)} unreachable "
                                            f"or not answering: {e}") from e
    except ex.ResponseError as e:
        msg = str(e)
        if _SCRIPT_ERROR in msg:
            raise EpochCommitError(f"{what}: {msg.split(_SCRIPT_ERROR, 1)[1].strip()}") from e
        if msg.startswith(("NOAUTH", "WRONGPASS", "NOPERM")):
            raise ExternalStoreAuthError(f"{what}: Redis at {_where(client)} refused the "
                                         f"credentials: {e}") from e
        raise ExternalStateError(f"{what}: Redis at {_where(client)} answered: {e}") from e
    except ex.RedisError as e:
        raise ExternalStateError(f"{what}: Redis at {_where(client)} failed: {e}") from e


def text_of(b) -> str:
    """``b`` as str (the client returns bytes)."""
    return b.decode() if isinstance(b, bytes) else str(b)


def check_config(client, keys: NamespaceKeys, key_type: str, max_parallelism: int,
                 assigner: str) -> int | None:
    """Record the namespace's key type, max parallelism and assigner if it has none yet, else
    check them (StateMigrationError when they differ: the encoded keys and key groups would
    not match); returns the committed epoch (None before the first commit)."""
    want = {"format": FORMAT, "key_type": key_type, "max_parallelism": str(max_parallelism),
            "assigner": assigner}
    with store_errors(client, f"opening namespace {keys.namespace!r}"):
        pipe = client.pipeline(transaction=True)
        for f, v in want.items():
            pipe.hsetnx(keys.meta, f, v)
        pipe.hgetall(keys.meta)
        meta = {text_of(k): text_of(v) for k, v in pipe.execute()[-1].items()}
    for f, v in want.items():
        if meta.get(f) != v:
            raise StateMigrationError(
                f"namespace {keys.namespace!r} holds state with {f}={meta.get(f)!r}, "
                f"this backend has {f}={v!r}")
    return int(meta["epoch"]) if "epoch" in meta else None


def committed_epoch(client, keys: NamespaceKeys) -> int | None:
    """The committed epoch of the namespace (None before the first commit)."""
    with store_errors(client, f"reading the committed epoch of {keys.namespace!r}"):
        v = client.hget(keys.meta, "epoch")
    return None if v is None else int(v)


def load_state_metas(client, keys: NamespaceKeys) -> dict:
    """``{state name: meta dict}`` of the committed states of the namespace."""
    with store_errors(client, f"reading the states of {keys.namespace!r}"):
        raw = client.hgetall(keys.states)
    return {text_of(k): json.loads(v) for k, v in raw.items()}


def _client(url_or_client, timeout_s: float):
    return connect(url_or_client, timeout_s) if isinstance(url_or_client, str) else url_or_client


def _check_epoch(epoch) -> int:
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise InvalidInputError(f"epoch must be an int >= 0, got {epoch!r}")
    return epoch


def commit_epoch(url_or_client, namespace: str, epoch: int, wal_key_names,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> bool:
    """Commit ``epoch`` of ``namespace``: apply every write-ahead log in ``wal_key_names`` (the
    names each task's ``RedisBackend.pre_commit`` returned, all of them: a task without
    changes pre-commits an empty log) to the committed state and record ``epoch`` as the
    committed epoch, in one Lua script (atomic in Redis: readers and a restarted server see
    the epoch whole or not at all). The coordinator's step, as Flink's
    ``TwoPhaseCommitSinkFunction.commit`` after the global snapshot completed.

    Returns True when this call committed the epoch, False when ``epoch`` was committed
    already (or an older epoch: the named logs are then deleted, never applied) -- so a
    coordinator may repeat a commit whose answer it lost. Raises EpochCommitError (a log
    missing, of another epoch or truncated: nothing changed), InvalidInputError for bad
    arguments, ExternalStoreUnavailableError / ExternalStoreAuthError / ExternalStateError
    when the store fails (the epoch is then either committed whole or not at all; call again
    to find out and finish).
    """
    epoch = _check_epoch(epoch)
    keys = NamespaceKeys(namespace)
    names = list(wal_key_names)
    for n in names:
        if not isinstance(n, str) or not n.startswith(keys.wal_prefix(epoch)):
            raise InvalidInputError(f"{n!r} is not a write-ahead log of epoch {epoch} of "
                                    f"namespace {namespace!r}")
    client = _client(url_or_client, timeout_s)
    with store_errors(client, f"committing epoch {epoch} of {namespace!r}"):
        done, _ = client.eval(_COMMIT_LUA, 4 + len(names), keys.meta, keys.states,
                              keys.groups, keys.pending, *names, str(epoch), keys.data_prefix,
                              WAL_MAGIC, _SCRIPT_ERROR)
    return bool(done)


def wal_keys(url_or_client, namespace: str, epoch: int,
             timeout_s: float = DEFAULT_TIMEOUT_S) -> list[str]:
    """The names of the write-ahead logs of ``epoch`` present in ``namespace``, sorted (the
    members of the namespace's pending set of that epoch: one ``SMEMBERS``, whatever else the
    database holds; a commit takes the names the tasks returned)."""
    epoch = _check_epoch(epoch)
    keys = NamespaceKeys(namespace)
    client = _client(url_or_client, timeout_s)
    prefix = keys.wal_prefix(epoch)
    with store_errors(client, f"listing the write-ahead logs of epoch {epoch}"):
        found = (text_of(k) for k in client.smembers(keys.pending))
        return sorted(k for k in found if k.startswith(prefix))


def abort_epoch(url_or_client, namespace: str, epoch: int, wal_key_names=None,
                timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Discard the write-ahead logs of uncommitted ``epoch`` (``wal_key_names``, default every
    log of the epoch present): its changes are never applied. Returns the number of logs
    deleted, -1 when ``epoch`` is committed already (nothing is deleted then). The tasks
    discard their caches (``RedisBackend.abort``) and replay from the committed epoch.

    One script, which without names finds the epoch's logs in the namespace's pending set: its
    cost is O(logs pending), independent of the other keys of the database (a coordinator
    calls this before every epoch). InvalidInputError for a name that is not a log of
    ``epoch`` of ``namespace``; store errors as :func:`commit_epoch`."""
    epoch = _check_epoch(epoch)
    keys = NamespaceKeys(namespace)
    prefix = keys.wal_prefix(epoch)
    if wal_key_names is None:
        names: list = []
    else:
        names = list(wal_key_names)
        for n in names:
            if not isinstance(n, str) or not n.startswith(prefix):
                raise InvalidInputError(f"{n!r} is not a write-ahead log of epoch {epoch} of "
                                        f"namespace {namespace!r}")
    client = _client(url_or_client, timeout_s)
    with store_errors(client, f"aborting epoch {epoch} of {namespace!r}"):
        return int(client.eval(_ABORT_LUA, 2 + len(names), keys.meta, keys.pending, *names,
                               str(epoch), prefix if wal_key_names is None else ""))


def read_committed_epoch(url_or_client, namespace: str,
                         timeout_s: float = DEFAULT_TIMEOUT_S) -> int | None:
    """The committed epoch of ``namespace`` (None before the first commit, or for a namespace
    never opened): what a coordinator compares with its own record of committed epochs when it
    restarts. Store errors as :func:`commit_epoch`."""
    return committed_epoch(_client(url_or_client, timeout_s), NamespaceKeys(namespace))
