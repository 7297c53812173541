"""Corpus indexing: a Faiss index of bundle embeddings beside a SQLite document store. No torch."""
