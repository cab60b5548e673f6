"""Exchange federation between pairs (docs/federation.md)."""
