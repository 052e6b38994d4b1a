"""Whether a script can reach torch (``zygote_program.reach``): only a script whose imports are
the standard library's and its own local modules', read transitively, is said not to; anything
that could load torch, or that cannot be read, says it may."""

from __future__ import annotations

from pathlib import Path

import pytest

from elasticd.workers.zygote_program import reach
from elasticd.workers.zygote_program.reach import cannot_reach_torch


def _script(tmp_path: Path, source: str, **modules: str) -> str:
    for name, text in modules.items():
        path = tmp_path / (name.replace(".", "/") + ".py")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    (tmp_path / "train.py").write_text(source)
    return str(tmp_path / "train.py")


def _files(tmp_path: Path, source: str, **modules: str) -> list[str] | None:
    entry = _script(tmp_path, source, **modules)
    found = cannot_reach_torch("script", entry, str(tmp_path))
    return None if found is None else sorted(str(Path(p).relative_to(tmp_path)) for p in found)


def test_a_standard_library_script_cannot_reach_torch(tmp_path: Path) -> None:
    source = "from __future__ import annotations\nimport os, json\nfrom os import path\nimport xml.dom\n"
    assert _files(tmp_path, source) == ["train.py"]


def test_local_modules_are_read_too(tmp_path: Path) -> None:
    got = _files(
        tmp_path,
        "import helpers\nfrom pkg.sub import x, leaf\n",
        helpers="import time\n",
        **{
            "pkg.__init__": "",
            "pkg.sub.__init__": "from . import leaf\nx = 1\n",
            "pkg.sub.leaf": "import re\n",
        },
    )
    assert got == ["helpers.py", "pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/leaf.py", "train.py"]


@pytest.mark.parametrize(
    "source",
    [
        "import torch\n",
        "from torch import nn\n",
        "import numpy\n",
        "import elasticd.worker\n",  # not the standard library: it may import torch
        "try:\n    import lightning\nexcept ImportError:\n    pass\n",
        "import importlib\nimportlib.import_module('torch')\n",
        "from importlib import import_module\n",
        "import runpy\n",
        "__import__('torch')\n",
        "exec('import torch')\n",
        "import missing_local.thing\n",
        "def broken(:\n",
    ],
)
def test_anything_that_could_load_torch_says_it_may(tmp_path: Path, source: str) -> None:
    assert _files(tmp_path, source) is None


def test_a_local_module_that_imports_torch_says_it_may(tmp_path: Path) -> None:
    model, layers = "import os\nfrom layers import Net\n", "import torch\n"
    assert _files(tmp_path, "import model\n", model=model, layers=layers) is None


def test_a_local_file_shadows_the_standard_library(tmp_path: Path) -> None:
    assert _files(tmp_path, "import json\n", json="import torch\n") is None


def test_an_import_cycle_is_read_once(tmp_path: Path) -> None:
    got = _files(tmp_path, "import a\n", a="import b\n", b="import a\nimport os\n")
    assert got == ["a.py", "b.py", "train.py"]


def test_bounds_and_what_cannot_be_told_say_it_may(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modules = {f"m{i}": f"import m{i + 1}\n" for i in range(5)} | {"m5": ""}
    monkeypatch.setattr(reach, "MAX_FILES", 4)
    assert _files(tmp_path, "import m0\n", **modules) is None
    monkeypatch.setattr(reach, "MAX_FILES", 64)
    assert _files(tmp_path, "import m0\n", **modules) is not None
    monkeypatch.setattr(reach, "MAX_BYTES", 8)
    assert _files(tmp_path, "import os  # a long line\n") is None
    entry = _script(tmp_path, "import os\n")
    assert cannot_reach_torch("module", "train", str(tmp_path)) is None  # -m: not read
    assert cannot_reach_torch("script", str(tmp_path / "gone.py"), str(tmp_path)) is None
    monkeypatch.delattr("sys.stdlib_module_names")  # an interpreter before 3.10 does not list it
    assert cannot_reach_torch("script", entry, str(tmp_path)) is None
