"""Coverage-guided fuzzing of statecore's entry points for untrusted bytes (atheris, libFuzzer).

Each target in :mod:`fuzz.targets` takes one input (bytes) and feeds it to a reader or decoder
of the package: data files, manifests, stored values, operator state entries and encoded keys
restored into both backends, Arrow columns through the batch API. A target may only fail with
:class:`statecore.errors.StateError` (the package's clear errors); any other exception, a crash,
a hang or a sanitizer report is a finding. ``python -m fuzz --help``: running targets, the
corpora under ``fuzz/corpus/<target>/`` and how they are made.
"""
