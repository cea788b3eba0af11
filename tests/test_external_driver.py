"""The driver side of the Spark operator on external keyed state, without Spark: the one list of
store URL schemes (statecore.external.urls), the operator's options for the cache in front of
the store, and the driver's connection to the store -- one per operator, reopened when the
server closed it, closed by ``StatefulOperator.close`` -- against a real redis-server and a
real PostgreSQL server."""

import pytest

from statecore.errors import InvalidInputError
from statecore.external import read_committed_epoch
from statecore.external.postgres_store import PgConnection, is_postgres
from statecore.external.urls import POSTGRES_SCHEMES, SCHEMES, is_postgres_url, store_kind
from statecore.spark import KeyedProcessor, StatefulOperator
from statecore.spark.external_commit import begin_epoch, driver_store
from statecore.spark.external_task import _open_backend
from statecore.spark.task import TaskSpec
from support.postgres_server import postgres_server  # noqa: F401  (fixture)
from support.redis_server import redis_server  # noqa: F401  (fixture)


class _Nothing(KeyedProcessor):
    import pyarrow as _pa

    output_schema = _pa.schema([("k", _pa.int64())])

    def process_batch(self, batch, ctx):
        return iter(())


def _sink(df, version):
    pass


def _op(tmp_path, url, **kw):
    return StatefulOperator("counts", _Nothing(), "k", str(tmp_path / "ckpt"), state_store=url,
                            sink=_sink,
                            **kw)


# ---------------------------------------------------------------------------- URL schemes

def test_every_scheme_names_one_store_and_postgres_is_recognized_by_the_same_list():
    assert set(SCHEMES.values()) == {"redis", "postgres"}
    for scheme, kind in SCHEMES.items():
        url = f"{scheme}user:pw@host:1/0"
        assert store_kind(url) == kind
        assert is_postgres(url) is (kind == "postgres") is is_postgres_url(url)
    assert POSTGRES_SCHEMES == ("postgresql://", "postgres://")
    assert not is_postgres("host=db user=app")  # a bare conninfo is a Redis URL there


@pytest.mark.parametrize("url", ["mysql://u:secret@h/db", "redis:/h", "", None, 5])
def test_a_state_store_url_of_no_store_is_refused_without_its_password(url):
    with pytest.raises(InvalidInputError, match="state_store must be a URL") as e:
        store_kind(url)
    assert "secret" not in str(e.value)
    for scheme in SCHEMES:
        assert scheme in str(e.value)


# ---------------------------------------------------------------------------- options

@pytest.mark.parametrize("kw, match", [
    ({"state_store_cache_entries": 0}, "state_store_cache_entries must be an int >= 1"),
    ({"state_store_cache_entries": 1.5}, "state_store_cache_entries must be an int >= 1"),
    ({"state_store_cache_entries": True}, "state_store_cache_entries must be an int >= 1"),
    ({"state_store_ttl_sweep_key_groups": -1}, "state_store_ttl_sweep_key_groups must be"),
    ({"state_store_ttl_sweep_key_groups": "4"}, "state_store_ttl_sweep_key_groups must be"),
])
def test_bad_cache_options_are_refused_naming_the_argument(tmp_path, kw, match):
    with pytest.raises(InvalidInputError, match=match):
        _op(tmp_path, "redis://127.0.0.1:1/0", **kw)


@pytest.mark.parametrize("kw", [{"state_store_cache_entries": 10},
                                {"state_store_cache_entries": None},
                                {"state_store_ttl_sweep_key_groups": 0}])
def test_cache_options_need_a_state_store(tmp_path, kw):
    with pytest.raises(InvalidInputError, match="needs state_store"):
        _op(tmp_path, None, **kw)


@pytest.fixture(params=["redis", "postgres"])
def server(request):
    return request.getfixturevalue(f"{request.param}_server")


def test_cache_options_reach_the_tasks_backend(tmp_path, server):
    op = _op(tmp_path, server.url, state_store_cache_entries=1234,
             state_store_ttl_sweep_key_groups=3)
    assert (op.state_store_cache_entries, op.state_store_ttl_sweep_key_groups) == (1234, 3)
    spec = TaskSpec(
        operator_name="counts", store_uri=op.store_uri, processor=op.processor,
        backend_kind="python", key_type="int64", key_column="k", event_time_column=None,
        max_parallelism=32, num_partitions=2, batch_id=0, prev_version=None, prev_attempt=None,
        attempt="a0", watermark_ms=None, is_flush=False, output_schema=op.processor.output_schema,
        state_store=server.url, state_namespace=op.state_namespace,
        state_store_cache_entries=op.state_store_cache_entries,
        state_store_ttl_sweep_key_groups=op.state_store_ttl_sweep_key_groups)
    b = _open_backend(spec, 1)
    try:
        assert b.cache_statistics()["max_entries"] == 1234
        assert b._sweep_key_groups == 3
        assert b.key_group_range.start == 16
    finally:
        b.dispose()


# ---------------------------------------------------------------------------- connection

def _connections(server) -> int:
    """Client connections the server holds now, ours for the count excluded."""
    if "postgres" in server.url:
        with PgConnection(server.url).transaction("counting") as conn:
            return conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'statecore' "
                "AND pid <> pg_backend_pid()").fetchone()[0]
    import redis

    c = redis.Redis.from_url(server.url)
    try:
        return len(c.client_list()) - 1
    finally:
        c.close()


def _kill_connections(server) -> None:
    if "postgres" in server.url:
        with PgConnection(server.url).transaction("killing") as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE "
                         "application_name = 'statecore' AND pid <> pg_backend_pid()")
        return
    import redis

    c = redis.Redis.from_url(server.url)
    try:
        c.client_kill_filter(skipme=True)
    finally:
        c.close()


def test_the_driver_keeps_one_connection_per_operator(tmp_path, server):
    op = _op(tmp_path, server.url)
    held = driver_store(op)
    for _ in range(5):
        assert begin_epoch(op, 0) is False
    assert driver_store(op) is held
    client = held.client
    assert _connections(server) == 1
    # The server ends the idle connection (a restart, an idle timeout, an administrator): the
    # next micro-batch's calls open a new one and go on.
    _kill_connections(server)
    assert _connections(server) == 0
    assert begin_epoch(op, 0) is False
    assert read_committed_epoch(held.client, op.state_namespace) is None
    assert _connections(server) == 1
    assert driver_store(op) is held and held.client is client
    op.close()
    assert _connections(server) == 0
    op.close()
    # A later micro-batch opens a new one.
    assert begin_epoch(op, 0) is False
    assert driver_store(op) is not held and _connections(server) == 1
    op.close()


def test_a_changed_store_setting_replaces_the_connection(tmp_path, server):
    op = _op(tmp_path, server.url)
    held = driver_store(op)
    begin_epoch(op, 0)
    op.state_store_timeout_s = 5.0
    assert driver_store(op) is not held
    begin_epoch(op, 0)
    assert _connections(server) == 1
    op.close()


# ---------------------------------------------------------------------------- the demo

def test_the_demo_passes_the_cache_options_to_its_operators(tmp_path):
    from statecore.cli import build_parser
    from statecore.demo.job import DemoConfig, DemoPipeline

    args = build_parser().parse_args(
        ["demo", "--state-store", "redis://127.0.0.1:1/0", "--state-store-cache-entries", "none",
         "--state-store-ttl-sweep-key-groups", "4", "--checkpoint", str(tmp_path / "c")])
    assert (args.state_store_cache_entries, args.state_store_ttl_sweep_key_groups) == (None, 4)
    cfg = DemoConfig(checkpoint=str(tmp_path / "c"), output=str(tmp_path / "o"),
                     state_store=args.state_store,
                     state_store_cache_entries=args.state_store_cache_entries,
                     state_store_ttl_sweep_key_groups=args.state_store_ttl_sweep_key_groups)
    cfg.validate()
    pipe = DemoPipeline(cfg)
    for op in (pipe.sessions, pipe.routes):
        assert (op.state_store_cache_entries, op.state_store_ttl_sweep_key_groups) == (None, 4)


@pytest.mark.parametrize("argv", [["--state-store-cache-entries", "0"],
                                  ["--state-store-cache-entries", "many"],
                                  ["--state-store-ttl-sweep-key-groups", "-1"]])
def test_the_demo_refuses_bad_cache_options(argv, capsys):
    from statecore.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["demo", "--state-store", "redis://127.0.0.1:1/0", *argv])
    assert "expected a" in capsys.readouterr().err


@pytest.mark.parametrize("kw, match", [
    ({"state_store_cache_entries": 5}, "state_store_cache_entries needs state_store"),
    ({"state_store": "redis://h:1/0", "state_store_ttl_sweep_key_groups": -2},
     "state_store_ttl_sweep_key_groups must be an int >= 0"),
])
def test_the_demo_config_checks_the_cache_options(kw, match):
    from statecore.demo.job import DemoConfig

    with pytest.raises(InvalidInputError, match=match):
        DemoConfig(**kw).validate()
