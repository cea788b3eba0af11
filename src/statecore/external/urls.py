"""The URL schemes of the external stores, listed once: which store a state store URL names
(docs/external-state.md). Imports nothing of statecore but its errors, so that the backends,
the coordinator and the Spark operator's driver all use it without an import cycle."""

from __future__ import annotations

from statecore.errors import InvalidInputError

__all__ = ["SCHEMES", "POSTGRES_SCHEMES", "store_kind", "is_postgres_url"]

#: URL scheme (with ``://``) -> the ``create_backend`` name of the store it names.
SCHEMES = {"redis://": "redis", "rediss://": "redis", "unix://": "redis",
           "postgresql://": "postgres", "postgres://": "postgres"}
#: The schemes of PostgreSQL URLs (libpq's URI forms).
POSTGRES_SCHEMES = tuple(s for s, kind in SCHEMES.items() if kind == "postgres")


def is_postgres_url(url) -> bool:
    """True when ``url`` is a str starting with a PostgreSQL scheme (:data:`POSTGRES_SCHEMES`)."""
    return isinstance(url, str) and url.startswith(POSTGRES_SCHEMES)


def store_kind(url) -> str:
    """The external backend (``create_backend`` name) of a state store URL: ``"redis"`` for
    ``redis://``, ``rediss://`` and ``unix://``, ``"postgres"`` for ``postgresql://`` and
    ``postgres://`` (what the URL leaves out comes from libpq's environment variables).
    InvalidInputError for anything else, naming the URL's scheme only (a URL may hold a
    password)."""
    if isinstance(url, str):
        for scheme, kind in SCHEMES.items():
            if url.startswith(scheme):
                return kind
    shown = url.split("://", 1)[0] + "://..." if isinstance(url, str) and "://" in url else url
    names = ", ".join(SCHEMES)
    raise InvalidInputError(
        f"state_store must be a URL of the store holding the keyed state ({names}), "
        f"got {shown!r}")
