"""The deterministic simulator of the replication protocol (``python -m tests.sim``)."""
