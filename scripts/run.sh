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

ensure_venv() {
  local extras="$1" stamp
  if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
  fi
  stamp="$VENV/.servetune-installed-$extras"
  if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[$extras]" 2>&1 \
      | grep -v "is ignored: it is neither a file nor a directory" || true
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
    # Two phases (docs/testing.md): the tests that start no engine on every core
    # (pytest-xdist), then the engine tests one at a time, so no engine's timing ever
    # shares the machine with the rest of the suite.
    echo "== pytest: tests without engines, on every core"
    first=0
    run_pytest -m "not engine" -n auto || first=$?
    echo "== pytest: engine tests, one at a time"
    second=0
    run_pytest -m engine || second=$?
    [ "$first" -eq 0 ] && [ "$second" -eq 0 ] && exit 0
    exit 1
    ;;
  *)
    echo "usage: scripts/run.sh main|test [args...]" >&2
    exit 2
    ;;
esac
