"""Which text a training run distils on: the corpus slice, the PCA-fit sentences, ``--extra-text``
sources and augmented copies, less every ``--exclude-text`` sentence."""

from __future__ import annotations

from dataclasses import dataclass

from distilembed.errors import UserError
from distilembed.paths import resolve_data_path
from training.config import TrainConfig
from training.data.extra_text import drop_excluded, excluded_keys, source_sentences
from training.data.text import read_sentences


def augmented_sets(texts: list[str], cfg: TrainConfig) -> list[list[str]]:
    """One augmented copy of ``texts`` per ``--augment`` method, in the order given."""
    if not cfg.augment:
        return []
    from training.augment import augment_corpus

    return [
        augment_corpus(texts, [method], seed=cfg.seed, synonym_p=cfg.synonym_p, deletion_p=cfg.deletion_p)
        for method in cfg.augment
    ]


@dataclass
class TrainingText:
    """The text a run distils on, less the ``--exclude-text`` sentences."""

    corpus: list[str]  # ``n_sentences`` of the corpus after its first ``skip_sentences``
    corpus_dropped: int
    pca_fit: list[str]  # what the PCA fits on (all of it: fitting is not training)
    extra: dict[str, list[str]]  # each ``--extra-text`` source
    pca_train: list[str]  # the PCA-fit sentences trained on (``--train-on-pca-texts``)
    excluded: int  # distinct normalised sentences kept out

    def more_sets(self) -> list[list[str]]:
        """The sets trained on besides the corpus and its augmentations, in training order."""
        return [*self.extra.values(), *([self.pca_train] if self.pca_train else [])]


def training_text(cfg: TrainConfig, data_dir: str | None) -> TrainingText:
    excluded = excluded_keys(cfg.exclude_text, data_dir)
    corpus = read_sentences(
        resolve_data_path(cfg.corpus, data_dir), limit=cfg.n_sentences, skip=cfg.skip_sentences
    )
    kept, dropped = drop_excluded(corpus, excluded)
    pca_fit = pca_fit_texts(cfg, data_dir)
    return TrainingText(
        corpus=kept,
        corpus_dropped=dropped,
        pca_fit=pca_fit,
        extra={s: drop_excluded(source_sentences(s, data_dir), excluded)[0] for s in cfg.extra_text},
        pca_train=drop_excluded(pca_fit, excluded)[0] if cfg.train_on_pca_texts else [],
        excluded=len(excluded),
    )


def pca_fit_texts(cfg: TrainConfig, data_dir: str | None) -> list[str]:
    """The unique sentences (sorted) of ``cfg.pca_fit``; empty when the PCA fits on the corpus."""
    if cfg.pca_fit == "corpus":
        return []
    path = resolve_data_path(cfg.pca_fit, data_dir)
    if not path.exists():
        raise UserError(f"--pca-fit file not found: {path}")
    return source_sentences(str(path))
