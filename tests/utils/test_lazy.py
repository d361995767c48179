"""LazyExports: a package's names imported on first access, from a table or from a type stub's re-exports."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from agentbolt.utils.lazy import LazyExports


@pytest.fixture
def package() -> types.ModuleType:
    module = types.ModuleType("lazy_test_package")
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_a_stub_exports_only_its_explicit_reexports(tmp_path: Path, package: types.ModuleType) -> None:
    stub = tmp_path / "__init__.pyi"
    stub.write_text(
        '"""Docs."""\n'
        "from json import dumps as dumps\n"
        "from json import loads\n"  # not a re-export in a stub
        "from os.path import join as join, split as splitter\n"
        "__version__: str\n",
        encoding="utf-8",
    )
    exports = LazyExports(package.__name__, stub)
    assert exports.names() == ["dumps", "join"]
    import json

    assert exports.load("dumps") is json.dumps and package.dumps is json.dumps
    with pytest.raises(AttributeError, match="'loads'"):
        exports.load("loads")


def test_the_stub_is_read_on_first_use_only(tmp_path: Path, package: types.ModuleType) -> None:
    stub = tmp_path / "__init__.pyi"
    exports = LazyExports(package.__name__, stub)  # the file does not exist yet: nothing is read here
    stub.write_text("from json import dumps as dumps\n", encoding="utf-8")
    assert "dumps" in exports.dir()


def test_a_table_maps_each_name_to_its_module(package: types.ModuleType) -> None:
    exports = LazyExports(package.__name__, {"json": ["dumps", "loads"]})
    assert exports.names() == ["dumps", "loads"]
    with pytest.raises(AttributeError, match=r"lazy_test_package.*'nothing'"):
        exports.load("nothing")
