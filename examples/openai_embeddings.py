"""Embeddings from a running distilembed service through the OpenAI Python SDK (``pip install openai``).

    distilembed serve                                    # models/default on 127.0.0.1:8080
    python examples/openai_embeddings.py --base-url http://127.0.0.1:8080/v1

The service speaks OpenAI's ``/v1/embeddings``: ``model`` is ignored (the served model answers),
``dimensions`` keeps the first N dimensions, re-normalised, and the SDK decodes its default
``encoding_format="base64"``. ``--api-key``: the service's key, if it has keys (``DISTILEMBED_READ_KEYS``).
"""

from __future__ import annotations

import argparse

from openai import OpenAI


def embed(
    texts: list[str], base_url: str, api_key: str = "unused", dimensions: int | None = None
) -> list[list[float]]:
    """One embedding per text, in order."""
    client = OpenAI(base_url=base_url, api_key=api_key)
    extra = {"dimensions": dimensions} if dimensions else {}
    response = client.embeddings.create(model="distilembed", input=texts, **extra)
    return [item.embedding for item in sorted(response.data, key=lambda item: item.index)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    parser.add_argument("--api-key", default="unused")
    parser.add_argument("--dimensions", type=int, default=None)
    args = parser.parse_args()
    texts = ["A man is playing a guitar.", "Someone plays an instrument.", "The weather is cold."]
    vectors = embed(texts, args.base_url, args.api_key, args.dimensions)
    similarity = sum(a * b for a, b in zip(vectors[0], vectors[1], strict=True))
    print(f"{len(vectors)} vectors of {len(vectors[0])} dimensions; cosine(0, 1) = {similarity:.3f}")


if __name__ == "__main__":
    main()
