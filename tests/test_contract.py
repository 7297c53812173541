"""The OpenAPI document is the contract: Schemathesis generates requests from the app's own
``/openapi.json`` (its examples, coverage and fuzzing phases, every check) and runs them in-process
against the ASGI app, with a fake encoder and a real index. Any finding fails the suite.

Profiles (``DISTILEMBED_CONTRACT=ci|deep``): ``ci`` (default) keeps the run short; ``deep`` is the
acceptance run (``DISTILEMBED_CONTRACT=deep pytest tests/test_contract.py``). Both use a fixed seed.
"""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import pytest

schemathesis = pytest.importorskip("schemathesis")

from service.app import create_app  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.testing import FakeEncoder  # noqa: E402
from tests.service_client import empty_index_dir  # noqa: E402

PROFILE = os.environ.get("DISTILEMBED_CONTRACT", "ci")
PROFILES = {"ci": {"max_examples": 15, "min_cases": 150}, "deep": {"max_examples": 150, "min_cases": 1000}}
SEED = 20261125
CASES: Counter[str] = Counter()


WRITE_KEY = "contract-write-key"


def _app(lexical: bool, **keys: str) -> object:
    """Built at import (schemathesis's lazy fixture loader does not run on pytest 9); the app's
    lifespan starts on the first request schemathesis sends. ``lexical``: the index has the lexical
    table (without it, the document offers dense searches only)."""
    index_dir = empty_index_dir(Path(tempfile.mkdtemp(prefix="contract-")) / "index", dim=8, lexical=lexical)
    settings = Settings(
        bundle=Path("fake-bundle"),
        index_dir=index_dir,
        warmup=False,
        max_items=16,
        max_chars=200,
        max_top_k=20,
        **keys,
    )
    return create_app(settings, FakeEncoder())


def _schema(app: object) -> object:
    loaded = schemathesis.openapi.from_asgi("/openapi.json", app)
    loaded.config.seed = SEED
    loaded.config.generation.update(max_examples=PROFILES[PROFILE]["max_examples"])
    # 413 is this API's documented answer to a size limit. For a schema-valid request it can only
    # mean what JSON Schema cannot say (a text over max_chars without `truncate`; a body over
    # max_payload_bytes), and it is a client error, so it rejects schema-violating data as well.
    for check in ("positive_data_acceptance", "negative_data_rejection"):
        config = getattr(loaded.config.checks, check)
        config.expected_statuses = [*config.expected_statuses, "413"]
    return loaded


schema = _schema(_app(lexical=True))
keyed_schema = _schema(_app(lexical=False, read_keys="contract-read-key", write_keys=WRITE_KEY))


@schema.parametrize()
def test_every_route_keeps_the_contract(case) -> None:
    CASES[case.operation.label] += 1
    case.call_and_validate()


@keyed_schema.parametrize()
def test_every_route_keeps_the_contract_with_keys(case) -> None:
    """Keys set: the generated requests carry a write key; the auth checks send none or a bad one."""
    CASES[case.operation.label] += 1
    case.call_and_validate(headers={"X-API-Key": WRITE_KEY})


def test_enough_cases_were_generated() -> None:
    """Runs after the parametrised test (file order): the fuzzer really exercised every route."""
    total = sum(CASES.values())
    print(f"\ncontract ({PROFILE}): {total} generated cases over {len(CASES)} operations")
    assert total >= PROFILES[PROFILE]["min_cases"], CASES
    assert len(CASES) >= 10 and min(CASES.values()) >= 3, CASES
