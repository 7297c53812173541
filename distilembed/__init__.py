"""distilembed: compact sentence embeddings distilled from large teachers, served fast on CPU."""

__version__ = "0.1.0"
