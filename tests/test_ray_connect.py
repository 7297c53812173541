"""Joining a Ray cluster from the CLI: a failure is one line naming the likely causes (the address,
Ray's token auth), a build that never reached its cluster leaves no OUT.partial, ``ray://`` is
refused by ``index build``, and a Serve already running keeps its own HTTP port, which the printed
URL then names.

The cluster cases run against a local cluster started here, which (Ray 2.60 on) uses token auth
unless RAY_AUTH_MODE=disabled: the CLI runs in a subprocess without, then with, the token.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from distilembed import ray_address
from distilembed.errors import UserError
from distilembed.ray_address import join_failure

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "models" / "default"
CORPUS = ROOT / "examples" / "data" / "faq.jsonl"


# ---- without a cluster


def _raised(message: str, cause: BaseException) -> BaseException:
    try:
        try:
            raise cause
        except BaseException as inner:
            raise ConnectionError(message) from inner
    except ConnectionError as exc:
        return exc


def test_a_refused_token_is_named_in_one_line() -> None:
    """What ray.init raises when the cluster refuses this process (its cause holds Ray's text)."""
    refused = _raised(
        "Failed to connect to Ray cluster at 10.0.0.5:6379",
        RuntimeError(
            "Failed to connect to GCS. ... RPC error: InvalidAuthToken: Authentication token is missing"
        ),
    )
    message = join_failure("10.0.0.5:6379", refused)
    assert message.startswith("the Ray cluster at 10.0.0.5:6379 uses token auth and refused this process")
    assert "RAY_AUTH_MODE=token" in message and "RAY_AUTH_TOKEN" in message and "\n" not in message
    # the C++ client's warnings alone (the exception may say less) are enough to tell
    plain = ConnectionError("Failed to connect to Ray cluster at 10.0.0.5:6379")
    said = "gcs_client.cc:210: Failed to get cluster ID from GCS server: Unauthenticated: RPC error"
    assert "uses token auth" in join_failure("10.0.0.5:6379", plain, said)


def test_other_failures_name_the_address_and_token_auth() -> None:
    gcs = join_failure("head:6379", ConnectionError("Failed to connect to Ray cluster at head:6379"))
    assert gcs.startswith("cannot join the Ray cluster at head:6379 (Failed to connect to Ray cluster")
    assert "GCS port, 6379" in gcs and "RAY_AUTH_MODE=token and RAY_AUTH_TOKEN" in gcs
    client = join_failure("ray://head:10001", ConnectionError("ray client connection timeout"))
    assert "Ray Client port, 10001" in client and "RAY_AUTH_TOKEN" in client
    missing = Exception("Token authentication is enabled but no authentication token was found. Note...")
    assert join_failure("head:6379", missing).startswith("RAY_AUTH_MODE=token but this process has no")
    assert all("\n" not in m for m in (gcs, client))


def test_rays_attempts_are_capped_unless_the_user_chose_a_number(monkeypatch: pytest.MonkeyPatch) -> None:
    name = ray_address.ATTEMPTS_VARIABLE
    monkeypatch.delenv(name, raising=False)
    with ray_address._attempts_at_most(3):
        assert os.environ[name] == "3"
    assert name not in os.environ
    monkeypatch.setenv(name, "60")
    with ray_address._attempts_at_most(3):
        assert os.environ[name] == "60"
    assert os.environ[name] == "60"


def test_stderr_is_held_at_the_descriptor_and_given_back() -> None:
    """Ray's C++ client writes to file descriptor 2 itself, past sys.stderr."""
    read, write = os.pipe()
    saved = os.dup(2)
    os.dup2(write, 2)  # stands for the terminal
    try:
        with ray_address._stderr_held() as held:
            os.write(2, b"a warning line from C++\n")
        os.write(2, b"after\n")
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(write)
    with os.fdopen(read) as pipe:
        assert pipe.read() == "after\n"
    assert held == ["a warning line from C++\n"]


def _work(tmp_path: Path, shards: int) -> tuple[Any, ...]:
    """A build over ray://, and its ``OUT.partial``: absent, or holding ``shards`` encoded splits."""
    from export.runtime import bundle_identity
    from index.build import build_identity
    from index.build_config import BuildConfig
    from index.corpus import CorpusSpec
    from index.splits import plan_corpus

    bundle = ROOT / "models" / "default"
    cfg = BuildConfig(
        bundle=str(bundle), out=str(tmp_path / "idx"), engine="ray", ray_address="ray://head:10001"
    )
    spec = CorpusSpec(CORPUS)
    plan = plan_corpus(spec, cfg.shard_size)
    work = tmp_path / "idx.partial"
    if shards:
        (work / "shards").mkdir(parents=True)
        identity = build_identity(cfg, spec, plan, bundle_identity(bundle))
        (work / "build.json").write_text(json.dumps(identity))
        for number in range(shards):
            (work / "shards" / f"{number}.npy").write_bytes(b"")
    return cfg, spec, work


def test_index_build_refuses_ray_client_and_leaves_no_partial(tmp_path: Path) -> None:
    """Ray Data needs its driver on a node: over ``ray://`` it ends in an AttributeError."""
    pytest.importorskip("ray")
    from index.build import build

    cfg, spec, work = _work(tmp_path / "new", shards=0)
    with pytest.raises(UserError, match=r"cannot drive a cluster through Ray Client \(ray://head:10001\)"):
        build(cfg, spec)
    assert not work.exists()  # nothing was encoded into it: gone
    cfg, spec, work = _work(tmp_path / "resumed", shards=1)
    with pytest.raises(UserError, match="Ray Client"):
        build(cfg, spec)
    assert (work / "shards" / "0.npy").exists()  # a resumable build keeps what it encoded


def test_a_running_serve_keeps_its_port_and_the_url_names_it(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("ray")
    from ray.serve import context

    from service import ray_serve
    from service.settings import Settings

    started: list[dict[str, Any]] = []
    monkeypatch.setattr(ray_serve.serve, "start", lambda **options: started.append(options))
    settings = Settings(bundle="b", host="127.0.0.1", port=9100)
    monkeypatch.setattr(context, "_get_global_client", lambda **_: None)
    assert ray_serve.start_serve(settings) == "http://127.0.0.1:9100"
    assert started[0]["http_options"] == {"host": "127.0.0.1", "port": 9100}
    running = SimpleNamespace(http_config=SimpleNamespace(host="0.0.0.0", port=8000))
    monkeypatch.setattr(context, "_get_global_client", lambda **_: running)
    with caplog.at_level(logging.WARNING, logger="distilembed.service"):
        assert ray_serve.start_serve(settings) == "http://0.0.0.0:8000"
    assert len(started) == 1  # Serve's HTTP options are the cluster's: not started again
    assert "already runs on this cluster, on 0.0.0.0:8000" in caplog.text


# ---- a local cluster with token auth


@pytest.fixture(scope="module")
def token_cluster() -> Iterator[str]:
    """A local cluster using token auth (Ray's default for ``ray.init``): its GCS address."""
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("this process is connected to a Ray cluster already")
    mode = os.environ.pop("RAY_AUTH_MODE", None)  # unset: Ray turns token auth on for a new cluster
    try:
        context = ray.init(
            num_cpus=1, object_store_memory=80 * 2**20, include_dashboard=False, log_to_driver=False
        )
        if os.environ.get("RAY_AUTH_MODE") != "token":
            ray.shutdown()
            pytest.skip("this Ray starts local clusters without token auth")
        yield context.address_info["gcs_address"]
    finally:
        ray.shutdown()
        os.environ.pop("RAY_AUTH_MODE", None)
        if mode is not None:
            os.environ["RAY_AUTH_MODE"] = mode


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "distilembed.cli", *args]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180, check=False
    )


def _without_token(home: Path) -> dict[str, str]:
    """This environment as a new user's shell: no Ray token settings, a home without ~/.ray."""
    drop = {"RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS"}
    return {k: v for k, v in os.environ.items() if k not in drop} | {"HOME": str(home)}


def test_without_the_token_a_build_fails_in_one_line_and_leaves_nothing(token_cluster, tmp_path) -> None:
    if not (BUNDLE / "manifest.json").is_file():
        pytest.skip("models/default bundle not present")
    out = tmp_path / "idx"
    args = ["--bundle", str(BUNDLE), "--corpus", str(CORPUS), "--out", str(out)]
    done = _cli(
        "index",
        "build",
        "--engine",
        "ray",
        "--ray-address",
        token_cluster,
        *args,
        env=_without_token(tmp_path),
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr  # not Ray's warning line a second
    assert f"the Ray cluster at {token_cluster} uses token auth" in lines[0]
    assert "RAY_AUTH_MODE=token" in lines[0] and "RAY_AUTH_TOKEN" in lines[0]
    assert list(tmp_path.glob("idx*")) == []  # no OUT.partial for a build that never started


def test_without_the_token_serve_fails_in_one_line(token_cluster, tmp_path) -> None:
    env = _without_token(tmp_path)
    done = _cli("serve", "--engine", "ray", "--ray-address", token_cluster, env=env)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "uses token auth" in lines[0], done.stderr


def test_with_the_token_in_the_environment_it_joins(token_cluster, tmp_path) -> None:
    """What docs/scaling.md says: RAY_AUTH_MODE=token and RAY_AUTH_TOKEN from `ray get-auth-token`
    (here from this machine's token, which the cluster started here uses)."""
    ray_cli = Path(sys.executable).with_name("ray")
    token = subprocess.run(
        [str(ray_cli), "get-auth-token"], capture_output=True, text=True, timeout=120, check=True
    ).stdout.strip()
    env = _without_token(tmp_path) | {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}
    code = (
        "import sys, ray\n"
        "from distilembed.ray_address import join\n"
        "join(sys.argv[1], log_to_driver=False)\n"
        "print(int(ray.cluster_resources()['CPU']))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, token_cluster],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0 and done.stdout.strip() == "1", done.stderr
