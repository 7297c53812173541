"""Serving stage: FastAPI app over an exported bundle and an optional live index (no torch)."""
