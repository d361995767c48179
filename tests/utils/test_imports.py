"""Optional dependencies: one wording for a missing extra, and the module itself when it is there."""

from __future__ import annotations

import json
import sys

import pytest

from agentbolt.utils.imports import import_extra


def test_an_installed_module_is_returned() -> None:
    assert import_extra("json", feature="Reading JSON", extra="base") is json


def test_a_missing_module_names_its_package_and_extra() -> None:
    with pytest.raises(ImportError) as caught:
        import_extra("agentbolt_absent_module.sub", feature="The absent feature", extra="absent")
    assert str(caught.value) == (
        "The absent feature needs the 'agentbolt_absent_module' package: pip install 'agentbolt[absent]'"
    )
    assert isinstance(caught.value.__cause__, ModuleNotFoundError)


def test_the_distribution_name_and_a_note_are_used_when_given() -> None:
    with pytest.raises(
        ImportError, match=r"^X needs the 'absent-dist' package: pip install 'agentbolt\[x\]' \(GPU only\)$"
    ):
        import_extra("absent_dist", feature="X", extra="x", package="absent-dist", note="GPU only")


def test_the_parquet_export_reports_a_missing_pyarrow(monkeypatch: pytest.MonkeyPatch) -> None:
    from agentbolt.algorithm.sft import export

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(
        ImportError,
        match=r"Reading or writing Parquet files needs the 'pyarrow' package: pip install 'agentbolt\[parquet\]'",
    ):
        export._pyarrow()
