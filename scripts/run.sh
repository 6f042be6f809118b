#!/usr/bin/env bash
# One entry point for the README's two commands and CI.
#   scripts/run.sh main   install servetune and run the main job on built-in defaults
#   scripts/run.sh test   install servetune + test tools (+ engines, cached) and run the whole suite
# Idempotent: the venv is reused; reinstall happens only when pyproject.toml changes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
VENV="${SERVETUNE_VENV:-$ROOT/.venv}"
PY="${PYTHON:-python3}"
# Bytecode is a cache like any other here. Container images often set
# PYTHONDONTWRITEBYTECODE (this host's does), and uv installs without .pyc files: then
# every Python process compiled each module it imported from source, ~2.9 s of a
# `servetune calibrate` that takes 3.5 s with them, in each of the hundreds of processes
# the suite and the tuner start. Written once, on first import, they are reused.
unset PYTHONDONTWRITEBYTECODE

# uv installs the project in ~6 s where pip takes ~30 s on a 2-core host; it reads no pip
# configuration, so scripts/uv_args.py hands it pip's indexes, find-links and constraints.
# Any failure of that path falls back to pip.
install_project() {
  local extras="$1" args=()
  if "$VENV/bin/python" -m pip install -q --disable-pip-version-check uv >/dev/null 2>&1 \
    && mapfile -t args < <("$VENV/bin/python" scripts/uv_args.py) \
    && "$VENV/bin/uv" pip install -q --python "$VENV/bin/python" "${args[@]}" -e ".[$extras]"; then
    return 0
  fi
  echo "uv could not install the project; installing with pip" >&2
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" || true
}

ensure_venv() {
  local extras="$1" stamp
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  stamp="$VENV/.servetune-installed-$extras"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    install_project "$extras"
    "$VENV/bin/python" -c "import servetune" # fail loudly if the install did not work
    touch "$stamp"
  fi
}

# pytest, where "collected no tests" (exit 5) is a failure, not a pass.
run_pytest() {
  local rc=0
  "$VENV/bin/python" -m pytest "$@" || rc=$?
  if [ "$rc" -eq 5 ]; then
    echo "pytest collected no tests: failing" >&2
    return 1
  fi
  return "$rc"
}

case "${1:-}" in
  main)
    shift
    # The main job: `servetune tune` on the built-in default (real llama.cpp + Gemma 3
    # 270M on this CPU). The engine is built once (cached; minutes the first time).
    ensure_venv "report"
    # The model download (242 MB, network-bound) runs while llama.cpp compiles (CPU-bound).
    "$VENV/bin/servetune" engine make-model --kind gemma-gguf >/dev/null &
    model_pid=$!
    "$VENV/bin/servetune" engine install llamacpp
    wait "$model_pid" || echo "model download failed; tune will retry it" >&2
    exec "$VENV/bin/servetune" tune "$@"
    ;;
  test)
    shift
    ensure_venv "test"
    echo "== engines (vLLM CPU + llama.cpp + MLX CPU + transformers serve + ONNX Runtime, cached: seconds after the first run)"
    "$VENV/bin/servetune" engine install all
    # ONNX Runtime serves a converted model: the builder's output, cached by hash (~20 s once)
    "$VENV/bin/servetune" engine make-model --kind onnx >/dev/null
    echo "== ruff"
    "$VENV/bin/ruff" check src tests benchmarks scripts
    "$VENV/bin/ruff" format --check src tests benchmarks scripts
    scripts/services.sh # PostgreSQL cluster + chromium for the store/report tests
    if [ "$#" -gt 0 ]; then
      echo "== pytest $*"
      rc=0
      run_pytest "$@" || rc=$?
      exit "$rc"
    fi
    # Two parts (docs/testing.md): the timed engine tests one at a time, and everything
    # else (the tests that start no engine, and the `untimed` engine tests, whose
    # assertions no host load can change). On an idle host they run at once: the engines
    # take one core each (vLLM-CPU binds its worker to one, the test llama.cpp runs one
    # thread), so the rest runs beside them on one core fewer than the machine has, at the
    # lowest priority, which keeps the timed tests' timing first (the engines a background
    # test starts inherit it). When other work already holds half a core or more, that
    # spare core is not there: the rest would get only scraps at nice 19 and its own
    # timed tests (mock servers at 80 req/s, a live view's exit) would starve, so the two
    # parts run one after the other, each with the host as it is.
    # On a 2-core host where the test model runs in float32 (x86 without AVX-512,
    # testmodel.fast_cpu_dtype), vLLM's worker, engine core and API server hold ~1.6 cores
    # while it serves, but the timed part as a whole averages 1.3 (engine starts, llama.cpp
    # on one thread, MLX, the tuner's studies: ~1.0); one after the other, the rest's
    # ~1,200 CPU-seconds wait for all of it (40 min in CI on that host, 2026-12-06). So
    # there the rest runs beside it on both cores, niced: it takes what the timed part
    # leaves, and both cores once the timed part is done (docs/testing.md).
    # `paced` tests start no engine but time the client's own sends: niced beside a vLLM
    # launch one was starved for 1.7 s (send lag P99), so they run with the timed part.
    timed="(engine and not untimed) or paced"
    rest="(not engine or untimed) and not paced"
    cores=$(nproc 2>/dev/null || echo 2)
    busy=$("$VENV/bin/python" -c 'import psutil; print(round(psutil.cpu_percent(interval=2) * psutil.cpu_count() / 100, 2))')
    dtype=$("$VENV/bin/python" -c 'from servetune.engines.testmodel import host_model_dtype as d; print(d())')
    spare=1
    awk -v b="$busy" 'BEGIN { exit !(b < 0.5) }' || spare=0
    workers=$((cores - 1))
    if [ "$cores" -le 2 ] && [ "$dtype" = float32 ]; then
      workers=$cores
    fi
    first=0
    second=0
    if [ "$cores" -gt 1 ] && [ "$spare" -eq 1 ]; then
      fast_log=$(mktemp "${TMPDIR:-/tmp}/servetune-fast-tests.XXXXXX")
      echo "== host: $busy of $cores cores busy before the suite: the two parts run at once"
      echo "== pytest: tests without engines and untimed engine tests ($workers worker(s), niced; log printed when done)"
      (
        renice -n 19 -p "$BASHPID" >/dev/null # pytest and its workers inherit it
        run_pytest -m "$rest" -n "$workers"
      ) >"$fast_log" 2>&1 &
      fast_pid=$!
      echo "== pytest: timed engine tests and paced tests, one at a time"
      run_pytest -m "$timed" || second=$?
      wait "$fast_pid" || first=$?
      echo "== pytest: tests without engines and untimed engine tests (ran beside the timed ones)"
      cat "$fast_log"
      rm -f "$fast_log"
    else
      echo "== host: $busy of $cores cores busy before the suite, no spare core (other work): the two parts run one after the other"
      echo "== pytest: timed engine tests and paced tests, one at a time"
      run_pytest -m "$timed" || second=$?
      echo "== pytest: tests without engines and untimed engine tests ($cores workers)"
      run_pytest -m "$rest" -n "$cores" || first=$?
    fi
    [ "$first" -eq 0 ] && [ "$second" -eq 0 ] && exit 0
    exit 1
    ;;
  *)
    echo "usage: scripts/run.sh main|test [args...]" >&2
    exit 2
    ;;
esac
