"""The demo's options for running against a cluster master: ``--conf KEY=VALUE`` (Spark settings
of the job's session) and ``--python-env ARCHIVE`` (a packed environment shipped to the
executors). Their use on a real standalone cluster is tests/test_spark_cluster.py."""

import pytest

from statecore.demo.job import DemoConfig
from statecore.errors import InvalidInputError
from support.demo_cli import parsed_demo_config


def _parsed(monkeypatch, argv):
    return parsed_demo_config(monkeypatch, argv)


def test_conf_and_python_env_reach_the_config(tmp_path, monkeypatch):
    env = tmp_path / "env.tar.gz"
    env.write_bytes(b"not read here")
    cfg = _parsed(monkeypatch, [
        "--master", "spark://127.0.0.1:7077", "--python-env", str(env),
        "--conf", "spark.executor.memory=1g", "--conf", "spark.driver.extraJavaOptions=-Da=b",
        "--conf", "spark.cores.max=2", "--conf", "spark.cores.max=3"])
    # The value keeps any '=' after the first; a repeated key takes the last value.
    assert cfg.spark_conf == {"spark.executor.memory": "1g",
                              "spark.driver.extraJavaOptions": "-Da=b", "spark.cores.max": "3"}
    assert cfg.python_env == str(env) and cfg.master == "spark://127.0.0.1:7077"
    cfg.validate()
    assert _parsed(monkeypatch, []).spark_conf == {}


@pytest.mark.parametrize("bad", ["spark.executor.memory", "=1g", " =x"])
def test_conf_without_a_key_and_value_is_refused(bad, capsys):
    from statecore.cli import main

    with pytest.raises(SystemExit) as e:
        main(["demo", "--conf", bad])
    assert e.value.code == 2
    assert "KEY=VALUE" in capsys.readouterr().err


def test_python_env_needs_a_cluster_master_and_a_file(tmp_path):
    env = tmp_path / "env.tar.gz"
    env.write_bytes(b"x")
    with pytest.raises(InvalidInputError, match="local master"):
        DemoConfig(python_env=str(env), master="local[2]").validate()
    with pytest.raises(InvalidInputError, match="not a file"):
        DemoConfig(python_env=str(tmp_path / "missing.tar.gz"),
                   master="spark://127.0.0.1:7077").validate()
    for bad in ({"spark.a": 1}, {"": "x"}, {1: "x"}, "spark.a=b"):
        with pytest.raises(InvalidInputError, match="spark_conf"):
            DemoConfig(spark_conf=bad).validate()
