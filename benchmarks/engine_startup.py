"""Launch-to-ready and first-completion (warm-up) time of an engine servetune installs,
on the seeded test Llama with real weights. Prints one line per config; no assertion.

    flock /tmp/servetune-engine.lock .venv/bin/python benchmarks/engine_startup.py transformers
    .venv/bin/python benchmarks/engine_startup.py mlx

`ready_s`: process start -> health answers (the model is loaded); `warmup_s`: the
launcher's first completion (4 tokens), where one-time costs land (continuous batching's
set-up in `transformers serve`), so that no measured request pays them.
"""

from __future__ import annotations

import sys

from servetune.engines import EngineConfig
from servetune.engines.install import install
from servetune.engines.process import launch
from servetune.engines.testmodel import make_llama_weights

# What each engine is started with: its sequential and its batching config.
CONFIGS = {
    "transformers": [
        EngineConfig(engine="transformers", dtype="float32", max_num_seqs=1),
        EngineConfig(engine="transformers", dtype="float32", max_num_seqs=4),
    ],
    "mlx": [EngineConfig(engine="mlx", max_num_seqs=1), EngineConfig(engine="mlx", max_num_seqs=4)],
}


def main(engines: list[str]) -> None:
    model = str(make_llama_weights())
    for engine in engines:
        install(engine, say=lambda _: None)
        for cfg in CONFIGS[engine]:
            with launch(engine, cfg, model, device="cpu", timeout_s=300) as srv:
                flags = " ".join(srv.spec.argv[srv.spec.argv.index("--port") + 2 :])
                print(
                    f"{engine:<12} [{flags or 'defaults'}] ready {srv.ready_s:.1f} s, "
                    f"first completion {srv.warmup_s:.1f} s",
                    flush=True,
                )


if __name__ == "__main__":
    main(sys.argv[1:] or list(CONFIGS))
