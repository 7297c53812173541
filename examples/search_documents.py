"""Documents and search over HTTP with ``requests``: add documents, search by text with a metadata
filter, fetch one, delete one. Needs a service with an index:

    distilembed serve --index runs/live --create-index
    python examples/search_documents.py --base-url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
from typing import Any

import requests

DOCS = [
    {"id": "cat", "text": "A cat is sleeping on the sofa.", "metadata": {"topic": "pets"}},
    {"id": "dog", "text": "The dog chased the ball across the park.", "metadata": {"topic": "pets"}},
    {"id": "market", "text": "The stock market fell sharply today.", "metadata": {"topic": "finance"}},
    {"id": "rain", "text": "Heavy rain is expected this weekend.", "metadata": {"topic": "weather"}},
]


class Client:
    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        self.base = base_url.rstrip("/")
        self.session = requests.Session()
        if api_key:
            self.session.headers["Authorization"] = f"Bearer {api_key}"

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.session.request(method, f"{self.base}{path}", timeout=30, **kwargs)
        if response.status_code >= 400:  # the service answers every error as {"error", "type"}
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.json()['error']}")
        return response.json()

    def upsert(self, docs: list[dict[str, Any]]) -> dict[str, Any]:
        return self._call("POST", "/documents", json={"documents": docs})

    def search(self, query: str, top_k: int = 3, where: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"query": query, "top_k": top_k} | ({"filter": where} if where else {})
        return self._call("POST", "/search", json=body)["results"]

    def get(self, doc_id: str) -> dict[str, Any]:
        return self._call("GET", f"/documents/{doc_id}")

    def delete(self, doc_id: str) -> dict[str, Any]:
        return self._call("DELETE", f"/documents/{doc_id}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8080")
    parser.add_argument("--api-key", default=None, help="a write key, if the service has keys")
    args = parser.parse_args()
    client = Client(args.base_url, args.api_key)
    print(client.upsert(DOCS))
    for hit in client.search("a kitten naps on the couch", where={"topic": "pets"}):
        print(f"{hit['score']:.3f}  {hit['id']}  {hit['text']}")
    print(client.get("rain")["text"])
    print(client.delete("rain"))


if __name__ == "__main__":
    main()
