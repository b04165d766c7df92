"""Cheap Python environments for the placement tests (``test_autograder_placements.py``) and the
Gradescope simulation: a real venv (``python -m venv --without-pip``, seconds) whose
site-packages holds symbolic links to every package this interpreter imports from, so that
torch, numpy and triton are found *through the venv's own directory*, wherever it is, without
reinstalling anything. This works whether the suite itself runs in the interpreter's prefix, in
a venv or in a conda environment (unlike a symlink to ``sys.executable``, which resolves to a
venv's base interpreter, without torch).
"""
from __future__ import annotations

import site
import subprocess
import sys
from pathlib import Path

# the course's own editable install stays out: the grader must use the copy it runs from
SKIP = ("__editable__", "llm_inference_course", "easy-install.pth", "__pycache__")


def site_dirs() -> list[Path]:
    """The site-packages directories of this interpreter, first match first."""
    dirs = [Path(d) for d in site.getsitepackages()]
    if site.ENABLE_USER_SITE:
        dirs.insert(0, Path(site.getusersitepackages()))
    return [d for d in dirs if d.is_dir()]


def venv_site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def link_packages(target: Path, only=None, skip=()) -> None:
    """Symlink into ``target`` every entry of this interpreter's site-packages (those named in
    ``only``, if given; not those in ``skip``)."""
    target.mkdir(parents=True, exist_ok=True)
    for folder in site_dirs():
        for entry in folder.iterdir():
            name = entry.name
            if any(s in name for s in SKIP) or (target / name).exists() or name in skip:
                continue
            if only is None or name.split("-")[0] in only:
                (target / name).symlink_to(entry)


def linked_venv(venv: Path, *, system_site: bool = False, skip=()) -> Path:
    """A venv at ``venv`` whose site-packages links to this interpreter's packages (but those in
    ``skip``); returns its ``python``."""
    command = [sys.executable, "-m", "venv", "--without-pip", str(venv)]
    subprocess.run(command + (["--system-site-packages"] if system_site else []), check=True,
                   timeout=60)
    link_packages(venv_site_packages(venv), skip=skip)
    return venv / "bin" / "python"
