"""``agentbolt models list|info|pull`` through the real command line entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentbolt.cli.app import run


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AGENTBOLT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "cache"


def test_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["models", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == "smollm2-135m-instruct" and rows[0]["pulled"] is False


def test_list_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["models", "list"]) == 0
    assert "smollm2-135m-instruct" in capsys.readouterr().out


def test_info_of_a_local_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2}))
    assert run(["models", "info", str(model)]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["source"] == "local" and info["num_hidden_layers"] == 2


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["models", "pull", "nope"], "unknown registry model 'nope'"),
        (["models", "info", "smollm2-135m-instruct"], "agentbolt models pull smollm2-135m-instruct"),
        (["models", "info", "./missing"], "neither a registry name"),
    ],
)
def test_errors_are_one_line_with_exit_code_2(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_a_cache_that_cannot_be_written_is_one_line(
    file_in_the_way: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AGENTBOLT_CACHE_DIR", str(file_in_the_way))
    assert run(["models", "pull"]) == 2
    err = capsys.readouterr().err
    assert "cannot write model 'smollm2-135m-instruct' to the cache" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    ("files", "fragment"),
    [
        ({"config.json": "{oops"}, "config.json' is not valid JSON"),
        ({"config.json": "[1, 2]"}, "config.json' holds a JSON list, not an object"),
        ({"config.json": "{}", "tokenizer_config.json": "{oops"}, "tokenizer_config.json' is not valid JSON"),
    ],
    ids=["invalid config", "config not an object", "invalid tokenizer config"],
)
def test_info_of_a_broken_model_directory_is_one_line(
    tmp_path: Path, files: dict[str, str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "m"
    model.mkdir()
    for name, text in files.items():
        (model / name).write_text(text)
    assert run(["models", "info", str(model)]) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1


def test_info_of_a_file_that_is_not_gguf_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_text("<html>not found</html>")
    assert run(["models", "info", str(fake)]) == 2
    err = capsys.readouterr().err
    assert "is not a GGUF file" in err and err.count("\n") == 1


def test_an_empty_model_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["models", "info", ""]) == 2
    err = capsys.readouterr().err
    assert "model name is empty" in err and err.count("\n") == 1
