"""servetune's build id: a digest of the package's code and data, so a stored run can say
which servetune produced it (the version string stays the same between releases)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import servetune
from servetune.build import build_id, tree_digest


def _tree(root: Path) -> Path:
    (root / "pkg" / "data").mkdir(parents=True)
    (root / "pkg" / "a.py").write_text("x = 1\n")
    (root / "pkg" / "data" / "t.json").write_text('{"m": [1, 2]}')
    return root / "pkg"


def test_the_digest_follows_content_not_place_or_by_products(tmp_path: Path) -> None:
    one = _tree(tmp_path / "one")
    two = tmp_path / "two" / "pkg"
    shutil.copytree(one, two)
    assert tree_digest(one) == tree_digest(two)  # another checkout of the same tree
    (two / "__pycache__").mkdir()
    (two / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\x00compiled")
    (two / "b.pyc").write_bytes(b"\x00")
    assert tree_digest(one) == tree_digest(two)  # bytecode is not the build
    (two / "data" / "t.json").write_text('{"m": [1, 3]}')  # one figure changed
    assert tree_digest(one) != tree_digest(two)
    shutil.rmtree(two)
    shutil.copytree(one, two)
    (two / "a.py").rename(two / "c.py")  # same bytes under another name
    assert tree_digest(one) != tree_digest(two)


def test_build_id_is_the_installed_packages_digest() -> None:
    bid = build_id()
    assert re.fullmatch(r"[0-9a-f]{12}", bid)
    assert bid == tree_digest(Path(servetune.__file__).resolve().parent)
