"""Readers for the corpora and benchmarks the papers use; each returns plain Python records."""
