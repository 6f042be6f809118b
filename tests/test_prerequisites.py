"""A missing system prerequisite is one line naming the tool and the command that installs
it, exit 2: run for real with a PATH that hides the tool."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from servetune.engines.install import apt_command

ROOT = Path(__file__).resolve().parents[1]


def path_without(tmp_path: Path, *hidden: str) -> str:
    """A PATH of one folder linking every program on the current PATH except `hidden`."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            link = bin_dir / name
            if name not in hidden and not link.is_symlink():
                link.symlink_to(Path(folder) / name)
    return str(bin_dir)


def install_llamacpp(
    path: str, cache: Path, what: str = "llamacpp"
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PATH": path, "SERVETUNE_CACHE": str(cache)}
    env.pop("CXX", None)
    env.pop("CC", None)
    return subprocess.run(
        [sys.executable, "-m", "servetune.cli.app", "engine", "install", what],
        capture_output=True, text=True, timeout=120, env=env,
    )  # fmt: skip


@pytest.mark.parametrize("what", ["llamacpp", "all"])
def test_install_llamacpp_without_cmake(tmp_path: Path, what: str) -> None:
    out = install_llamacpp(path_without(tmp_path, "cmake"), tmp_path / "cache", what)
    assert out.returncode == 2
    assert out.stderr == f"error: cmake not found: {apt_command(['cmake', 'g++'])}\n"
    # Nothing was downloaded or built before the check (`all` would start with vLLM).
    engines = tmp_path / "cache" / "engines"
    assert not (engines / "llamacpp" / "src").exists() and not (engines / "vllm").exists()


def test_install_llamacpp_without_a_cpp_compiler(tmp_path: Path) -> None:
    hidden = ("c++", "g++", "clang++")
    out = install_llamacpp(path_without(tmp_path, *hidden), tmp_path / "cache")
    assert out.returncode == 2
    assert out.stderr == f"error: g++ not found: {apt_command(['cmake', 'g++'])}\n"


def test_install_llamacpp_without_a_build_program(tmp_path: Path) -> None:
    out = install_llamacpp(path_without(tmp_path, "make", "ninja"), tmp_path / "cache")
    assert out.returncode == 2
    assert out.stderr == f"error: make not found: {apt_command(['cmake', 'g++', 'make'])}\n"


def test_apt_command_uses_sudo_unless_root() -> None:
    expected = "apt-get install -y cmake" if os.geteuid() == 0 else "sudo apt-get install -y cmake"
    assert apt_command(["cmake"]) == expected


def _non_root() -> list[str]:
    """A prefix running a command as an unprivileged user (we may be root here)."""
    if os.geteuid() != 0:
        return []
    if not shutil.which("runuser"):
        pytest.skip("running as root without runuser: cannot drop privileges")
    return ["runuser", "-u", "nobody", "--"]


def test_services_without_root_is_one_line_with_the_apt_command() -> None:
    prefix = _non_root()
    # pytest's tmp_path sits in a root-only folder: the unprivileged user needs its own.
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        work.chmod(0o777)
        path = path_without(work, "chromium", "sudo")
        script = work / "scripts" / "services.sh"  # a copy: the checkout may be private
        script.parent.mkdir()
        shutil.copy(ROOT / "scripts" / "services.sh", script)
        out = subprocess.run(
            [*prefix, "env", f"PATH={path}", f"SERVETUNE_SERVICES_DIR={work / 'svc'}",
             "bash", str(script), "chromium"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == (
        "error: chromium not found: sudo apt-get install -y chromium fonts-dejavu-core"
        " (needs root or sudo)\n"
    )


def test_vllm_install_refuses_a_disk_too_small(tmp_path: Path, monkeypatch) -> None:
    """Checked before the venv is made; the real free space, against a need no disk meets."""
    from servetune.engines import install
    from servetune.errors import InputError

    monkeypatch.setenv("SERVETUNE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(install, "VLLM_DISK_NEEDED_GIB", 1e9)
    with pytest.raises(InputError) as err:
        install.install_vllm(say=lambda m: pytest.fail(f"no step may run: {m}"))
    line = err.value.one_line()
    assert line.startswith("disk: the vLLM CPU venv needs ~1000000000.0 GiB free, ")
    assert line.endswith("(free space, or point SERVETUNE_CACHE at a bigger disk)")
    assert not install.vllm_python().exists()
