"""Test support shipped with statecore: the backend conformance suite (:mod:`.conformance`)."""
