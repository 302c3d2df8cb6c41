"""Root conftest: a thin face over harness/ — profiles under profiles/ become parity items."""

pytest_plugins = ["harness.pytest_plugin"]
