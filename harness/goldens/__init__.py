"""Goldens: the oracle's records, stored as manifests plus content-addressed blobs, and their lifecycle."""
