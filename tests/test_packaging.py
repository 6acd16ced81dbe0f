"""A non-editable install must carry templates/ and patches/ inside the package."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_ships_templates_and_patches(tmp_path):
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    wheel = next(tmp_path.glob("specdec_compile-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    for t in (ROOT / "templates").iterdir():
        assert f"specdec_compile/templates/{t.name}" in names
    for p in (ROOT / "patches").iterdir():
        assert f"specdec_compile/patches/{p.name}" in names
    # resources finds the packaged copy first: unpack and import from there
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    code = ("import specdec_compile.resources as r; print(r.templates_dir()); print(r.patches_dir())")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={"PYTHONPATH": str(site), "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [str(site / "specdec_compile" / "templates"),
                                       str(site / "specdec_compile" / "patches")]
