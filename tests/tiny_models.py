"""Tiny randomly initialised BERT encoders, built in-process, for fast offline tests."""

from __future__ import annotations

from pathlib import Path

WORDS = (
    "a",
    "the",
    "man",
    "woman",
    "dog",
    "cat",
    "is",
    "are",
    "playing",
    "eating",
    "running",
    "on",
    "in",
    "with",
    "guitar",
    "food",
    "park",
    "street",
    "red",
    "blue",
    "big",
    "small",
    "quickly",
    "slowly",
    "and",
    "of",
    "to",
    "cooks",
    "plays",
    "walks",
    "sits",
    "reads",
    "book",
    "car",
    "house",
)


def make_tiny_bert(path: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> Path:
    """A BERT folder (config, weights, WordPiece tokenizer) that AutoModel/AutoTokenizer load."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    letters = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    vocab = [
        "[PAD]",
        "[UNK]",
        "[CLS]",
        "[SEP]",
        "[MASK]",
        *WORDS,
        *letters,
        *[f"##{c}" for c in letters],
        ".",
        ",",
        "?",
        "!",
    ]
    (path / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    BertTokenizerFast(vocab_file=str(path / "vocab.txt"), do_lower_case=True).save_pretrained(path)
    torch.manual_seed(seed)
    config = BertConfig(
        vocab_size=len(dict.fromkeys(vocab)),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=hidden * 2,
        max_position_embeddings=128,
    )
    BertModel(config).save_pretrained(path)
    return path


def make_tiny_sentence_model(path: Path, hidden: int = 48, layers: int = 2, seed: int = 1) -> Path:
    """A sentence-transformers folder (Transformer -> mean Pooling -> Normalize) over a tiny BERT."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import modules as models

    raw = make_tiny_bert(path.with_name(path.name + "-raw"), hidden=hidden, layers=layers, seed=seed)
    transformer = models.Transformer(str(raw), max_seq_length=64)
    pooling = models.Pooling(hidden, pooling_mode="mean")
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()]).save(str(path))
    return path


def tiny_sentences(n: int, seed: int = 0) -> list[str]:
    import random

    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) + " ." for _ in range(n)]
