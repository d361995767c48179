"""``agentbolt serve --engine E``: an option that engine E does not honour is refused in one line (exit code 2) naming
the option and the engine, before any engine is imported or launched; the options it honours are passed on.

vLLM and llama.cpp are not installed here: without ``--dry-run`` a command that got past the check would fail on
the missing program with another message.
"""

from __future__ import annotations

from typing import List

import pytest

from agentbolt.cli.app import run


@pytest.mark.parametrize("dry_run", [True, False])
@pytest.mark.parametrize(
    ("engine", "options", "message"),
    [
        ("vllm", ["--body-timeout", "5"], "--body-timeout applies to the transformers engine only, not --engine vllm"),
        (
            "llamacpp",
            ["--max-request-bytes", "1000"],
            "--max-request-bytes applies to the transformers engine only, not --engine llamacpp",
        ),
        (
            "vllm",
            ["--max-prompts-per-request", "2", "--max-sequences-per-request", "3", "--max-queued-tokens", "100"],
            "--max-prompts-per-request and --max-sequences-per-request and --max-queued-tokens apply to the "
            "transformers engine only, not --engine vllm",
        ),
        (
            "llamacpp",
            ["--dtype", "float32", "--max-batch-size", "4"],
            "--dtype and --max-batch-size apply to the transformers and vllm engines only, not --engine llamacpp",
        ),
        (
            "vllm",
            ["--threads", "2"],
            "--threads applies to the transformers and llamacpp engines only, not --engine vllm",
        ),
        (
            "vllm",
            ["--no-fast-forward", "--prefix-cache-mb", "0", "--omp-wait", "passive"],
            "--omp-wait and --fast-forward/--no-fast-forward and --prefix-cache-mb apply to the transformers engine "
            "only, not --engine vllm",
        ),
        (
            "llamacpp",
            ["--body-timeout", "5", "--threads", "2", "--max-batch-size", "4"],
            "--max-batch-size applies to the transformers and vllm engines only; --body-timeout applies to the "
            "transformers engine only, not --engine llamacpp",
        ),
    ],
)
def test_an_option_the_engine_does_not_honour_is_refused(
    engine: str, options: List[str], message: str, dry_run: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["serve", "org/model" if engine == "vllm" else "smollm2-135m-instruct", "--engine", engine, *options]
    assert run(argv + (["--dry-run"] if dry_run else [])) == 2
    captured = capsys.readouterr()
    assert captured.err == f"agentbolt: error: {message}\n"
    assert not captured.out  # no command printed, nothing launched


def test_an_option_of_the_launched_engines_is_refused_by_the_transformers_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert run(["serve", "--dry-run", "--extra-arg", "--enforce-eager"]) == 2
    assert capsys.readouterr().err == (
        "agentbolt: error: --dry-run/--no-dry-run and --extra-arg apply to the llamacpp and vllm engines only, "
        "not --engine transformers\n"
    )


@pytest.mark.parametrize(
    ("engine", "options", "passed"),
    [
        ("vllm", ["--dtype", "float16", "--max-batch-size", "4"], "--dtype float16 --max-num-seqs 4"),
        ("llamacpp", ["--threads", "2"], "--n_threads 2"),
    ],
)
def test_the_options_the_engine_honours_are_passed_on(
    engine: str, options: List[str], passed: str, capsys: pytest.CaptureFixture[str]
) -> None:
    model = "org/model" if engine == "vllm" else "smollm2-135m-instruct"
    assert run(["serve", model, "--engine", engine, "--dry-run", *options]) == 0
    assert passed in capsys.readouterr().out
