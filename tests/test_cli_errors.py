"""Usage errors from the CLI are a short message and exit 2, never a traceback (typer raises its
vendored click's exceptions, which the entry point must recognise too)."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["index", "build"], "Missing option '--bundle'"),
        (["index"], "Usage: "),
        (["nosuch"], "No such command"),
        (["index", "build", "--bundle", "b", "--corpus", "c", "--out", "o", "--nlist", "0"], "'--nlist'"),
        (["index", "search", "--index", "i", "--query", "q", "-k", "0"], "'-k' / '--top-k'"),
        (["export", "--model", "m", "--out", "o", "--smooth-alpha", "1.5"], "'--smooth-alpha'"),
    ],
)
def test_usage_errors_exit_2_without_a_traceback(args: list[str], expected: str) -> None:
    command = [sys.executable, "-m", "distilembed.cli", *args]
    done = subprocess.run(command, check=False, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode == 2
    assert expected in output and "Traceback" not in output


def test_entry_point_keeps_exit_codes_and_real_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """typer.Exit keeps its code; an unexpected error propagates as itself (the handler once raised
    AttributeError on every unexpected error, hiding it)."""
    import typer

    from distilembed import cli

    def raising(error: BaseException):
        def fake_app(**_: object) -> None:
            raise error

        return fake_app

    monkeypatch.setattr(cli, "_register", lambda: None)
    monkeypatch.setattr(cli, "app", raising(typer.Exit(3)))
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 3
    monkeypatch.setattr(cli, "app", raising(KeyError("bundle")))
    with pytest.raises(KeyError, match="bundle"):
        cli.main()


@pytest.fixture
def not_a_checkpoint(tmp_path: Path) -> Path:
    """An exported bundle's shape: a manifest of another kind, no modules.json."""
    folder = tmp_path / "bundle"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"kind": "bundle"}))
    return folder


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["eval", "--model", "/no/such/model"], "model not found: '/no/such/model' is not a folder"),
        (["export", "--model", "./no-such-model", "--out", "{tmp}/b"], "model not found: './no-such-model'"),
        (["whiten", "{bundle}", "--out", "{tmp}/w"], "this needs a training checkpoint"),
        (["average", "{bundle}", "{bundle}", "--out", "{tmp}/a"], "is a 'bundle' directory"),
        (["index", "search", "--index", "{tmp}", "--query", "q"], "not an index directory"),
        (["index", "search", "--index", "{tmp}", "--query", "  "], "--query is empty"),
        (["index", "search", "--index", "{bundle}", "--query", "q"], "is a 'bundle', not an index"),
        (["train", "--student", "/no/such/student", "--out", "{tmp}/run"], "not found: '/no/such/student'"),
        (["train", "--init-from", "{bundle}", "--out", "{tmp}/run"], "this needs a training checkpoint"),
        (["train", "--ensemble-teacher", "./x:0.3", "--out", "{tmp}/run"], "model not found: './x'"),
        (["train", "--device", "cuda", "--out", "{tmp}/run"], "--device cuda: no CUDA GPU here"),
        (["train", "--max-steps", "0", "--out", "{tmp}/run"], "--max-steps must be positive"),
        (["train", "--teacher-batch-size", "0", "--out", "{tmp}/run"], "--teacher-batch-size must be"),
        (["train", "--seed", "-1", "--out", "{tmp}/run"], "--seed must be in [0, 2**32)"),
        (["train", "--patience", "-1", "--out", "{tmp}/run"], "--patience must be >= 0"),
        (["train", "--layers", "99", "--out", "{tmp}/run"], "has 6 layers"),
        (
            ["train", "--matryoshka", "128,64", "--matryoshka-weights", "1", "--out", "{tmp}/run"],
            "--matryoshka-weights needs 2 values, got 1",
        ),
        (["eval", "--model", "all-MiniLM-L6-v2", "--device", "nope"], "--device 'nope'"),
    ],
)
def test_wrong_paths_are_one_line_errors(
    args: list[str],
    expected: str,
    tmp_path: Path,
    not_a_checkpoint: Path,
    tiny_data: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A path that is not the artifact a command needs, or no model at all, is named in one line
    (exit 2) before any work starts; ``train`` leaves no unfinished run behind."""
    from distilembed import cli

    argv = [a.format(tmp=tmp_path, bundle=not_a_checkpoint) for a in args]
    if "cuda" in argv and __import__("torch").cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    monkeypatch.setenv("DISTILEMBED_DATA_DIR", str(tiny_data))
    monkeypatch.setattr(sys, "argv", ["distilembed", *argv])
    with pytest.raises(SystemExit) as exited:
        cli.main()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert exited.value.code == 2
    assert len(errors) == 1 and expected in errors[0], errors
    assert not (tmp_path / "run.partial").exists()


def test_a_model_name_is_a_folder_a_packaged_teacher_or_a_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distilembed.errors import UserError
    from training.teachers import resolve_model

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()  # "runs/missing" has a hub id's shape, but runs/ is a folder here
    assert resolve_model("BAAI/bge-small-en-v1.5") == "BAAI/bge-small-en-v1.5"  # left to the hub
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "modules.json").write_text("[]")
    assert resolve_model(str(tmp_path / "student")) == str(tmp_path / "student")
    for path_like in (
        "/abs/missing",
        "./missing",
        "../missing",
        "a/b/c",
        "trailing/",
        "~/missing",
        "runs/missing",
    ):
        with pytest.raises(UserError, match="model not found"):
            resolve_model(path_like)


def _one_error(result, expected: str) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2, result.stderr
    assert len(errors) == 1 and expected in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    return errors[0]


def test_train_without_data_says_how_to_point_at_it_and_leaves_no_partial(
    run_cli, tiny_teacher: Path, tiny_bert: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DISTILEMBED_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    models = ["--teacher", str(tiny_teacher), "--student", str(tiny_bert)]
    line = _one_error(run_cli("train", "--out", str(out), *models), "corpus not found: unlabeled/")
    assert "--corpus" in line and "DISTILEMBED_DATA_DIR" in line
    assert not out.with_name("run.partial").exists()


@pytest.mark.parametrize("command", [["eval"], ["export", "--out", "bundle"]])
def test_a_path_under_a_local_folder_is_not_sent_to_the_hub(
    command: list[str], run_cli, tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``runs/student`` has a hub id's shape; with a folder ``runs/`` here it is a mistyped path, named
    at once (the hub would retry for ~90 s before "no such folder")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    result = run_cli(*command, "--model", "runs/student", env={"DISTILEMBED_DATA_DIR": str(tiny_data)})
    _one_error(result, "model not found: 'runs/student' is not a folder (runs/ is a local folder)")


# What the serving-only install (DISTILEMBED_EXTRAS=serve) lacks, blocked before the CLI starts.
NOT_IN_SERVE = "torch transformers sentence_transformers sklearn scipy nltk matplotlib datasets onnx"
SERVE_ONLY = f"""
import sys
sys.modules.update(dict.fromkeys({NOT_IN_SERVE!r}.split()))
from distilembed.cli import main
main()
"""


@pytest.mark.parametrize(
    ("args", "extra"),
    [
        (["train", "--out", "{tmp}/run"], "train"),
        (["eval", "--model", "{tmp}"], "train"),
        (["export", "--model", "{tmp}", "--out", "{tmp}/bundle"], "export"),
        (["whiten", "{tmp}", "--out", "{tmp}/w"], "train"),
        (["finetune", "{tmp}", "--out", "{tmp}/f"], "train"),
        (["rotate", "{tmp}", "--out", "{tmp}/r"], "train"),
        (["average", "{tmp}", "{tmp}", "--out", "{tmp}/a"], "train"),
    ],
)
def test_a_command_without_its_extra_names_the_extra(args: list[str], extra: str, tmp_path: Path) -> None:
    argv = [a.format(tmp=tmp_path) for a in args]
    done = subprocess.run(
        [sys.executable, "-c", SERVE_ONLY, *argv], check=False, capture_output=True, text=True, timeout=60
    )
    expected = f"distilembed {argv[0]} needs the '{extra}' extra"
    line = _one_error(done, expected)
    assert line.endswith(f"pip install 'distilembed[{extra}]'")


def test_extras_named_are_the_projects() -> None:
    import tomllib

    from distilembed.cli import MODULES_OF_EXTRA

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"]
    assert set(MODULES_OF_EXTRA) <= set(extras["optional-dependencies"])


def test_serve_on_a_busy_port_fails_before_loading_anything(
    run_cli, tmp_path: Path, clean_service_env: None
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        missing = tmp_path / "no-bundle"  # the bundle error would come first if it loaded
        result = run_cli("serve", "--bundle", str(missing), "--host", "127.0.0.1", "--port", str(port))
    _one_error(result, f"port {port} on 127.0.0.1 is in use")


def test_help_shows_train_defaults_and_the_ray_extra(run_cli) -> None:
    from training.config import TrainConfig

    wide = {"COLUMNS": "250"}
    train = run_cli("train", "--help", env=wide).stdout.splitlines()
    dim = next(line for line in train if "--dim " in line)
    assert f"[default: ({TrainConfig().dim})]" in dim
    assert "[default: (amp)]" in next(line for line in train if "--amp " in line)
    for command in (["index", "build"], ["serve"]):
        assert "the [ray] extra" in run_cli(*command, "--help", env=wide).stdout


def test_onnx_libraries_info_lines_are_dropped_but_their_warnings_and_ours_kept() -> None:
    import logging

    import onnxruntime

    from distilembed.cli import LibraryInfo

    drop = LibraryInfo("onnx", "onnxruntime")
    inside = str(Path(onnxruntime.__file__).parent / "transformers" / "fusion_base.py")

    def record(level: int, path: str) -> logging.LogRecord:
        return logging.LogRecord("fusion_base", level, path, 1, "fused", None, None)

    assert not drop.filter(record(logging.INFO, inside))
    assert drop.filter(record(logging.WARNING, inside))
    assert drop.filter(record(logging.INFO, __file__))
