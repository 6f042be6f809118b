"""Buffered streaming: a server that holds every chunk and sends them all at the end.

Its stream looks valid, but the first content chunk arrives when the answer is done,
so the client's TTFT is the E2E latency and the inter-token gaps are socket-read noise.
Seen on onnx-genai-server (issue notes, 2026-12: "buffers every stream to the end");
any proxy that does not flush SSE does the same. Such a run's TTFT, TPOT and ITL are
not measurable and must not be reported as numbers.

A request looks buffered when its content chunks all arrive within a few ms of each
other although it carried several tokens and took long from send to last chunk. The
thresholds are chosen so no real token-by-token decode can pass them: even the fastest
decode on current hardware takes over 1 ms per token per sequence, while buffered chunks
are written together in one syscall (tens of microseconds apart).

The span leaves out the one longest gap between two chunks: a client that the OS
descheduled once while it parsed a burst stamps one long gap into it (onnx-genai-server
with the rest of the test suite running beside it: 24 chunks, 23 gaps of 0 ms and one of
5-15 ms). A real decode has a step's gap between every two tokens, so one gap left out
changes nothing there.

A held stream is several events, each with its own token or few. An answer that came as
one or two events, each carrying many tokens, is not: that is an engine whose API server
fell behind its own decode (vLLM merges the pending tokens of a request into one delta
when its output loop runs late, as on a host whose other core is busy; seen in the
fidelity harness's one-user runs under a CPU hog). Its first token really reached the
client that late, so its TTFT is measured, not hidden.

A server that buffers holds every answer. One that streams can still deliver a whole
answer in one burst now and then: its API server, or the client, starved of CPU for a
moment on a busy host, then writes (or reads) every event it owes at once. vLLM-CPU with
the test suite running beside it: 12 users on 4 seqs, 6 of 24 answers came whole in one
burst (at least 12 of 24 in one CI run, 2026-12) while the others streamed a token every
~17 ms. So a run is buffered only when most judged answers came held *and* next to none
came token by token: a few answers streamed prove the path streams, and the bursts were
stalls whose first tokens really came that late (their TTFT is measured).
"""

from __future__ import annotations

import numpy as np

NS_PER_MS = 1_000_000
MIN_TOKENS = 4  # fewer tokens: too few gaps to judge
MIN_E2E_MS = 50.0  # "E2E is long": shorter answers cannot be told from a fast engine
MAX_SPAN_MS = 5.0  # "within a few ms": all content chunks inside this span...
MAX_SPAN_SHARE = 0.05  # ...and inside this share of send -> last chunk
MAX_MS_PER_TOKEN = 0.25  # ...and faster than any real decode (see module docstring)
MIN_HELD_CHUNKS = 3  # a held stream: at least this many content events...
MAX_TOKENS_PER_CHUNK = 2.0  # ...of about one token each (a merged delta carries many)
RUN_SHARE = 0.5  # a run is buffered when at least this share of judged requests is...
STREAMED_SHARE = 0.1  # ...and fewer than this share of them (and fewer than
STREAMED_MIN = 3  # this many) came token by token


def buffered_mask(
    send: np.ndarray,
    first: np.ndarray,
    last: np.ndarray,
    output_tokens: np.ndarray,
    judged: np.ndarray,
    chunks: np.ndarray,
    largest_gap: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(eligible, buffered, streamed) masks over requests: `eligible` are the `judged`
    requests with enough tokens and a long enough E2E to tell; of those, `buffered` sent
    several events of about a token each all together at the end, `streamed` sent them
    spread out as a decode does. Times in ns (first/last: first and last content chunk);
    `chunks`: content events per request; `largest_gap`: the longest wait between two of
    them, left out of the span."""
    e2e_ms = (last - send) / NS_PER_MS
    span_ms = (last - first - largest_gap) / NS_PER_MS
    tokens = np.maximum(output_tokens, 1)
    eligible = judged & (output_tokens >= MIN_TOKENS) & (e2e_ms >= MIN_E2E_MS)
    token_events = (chunks >= MIN_HELD_CHUNKS) & (
        tokens <= MAX_TOKENS_PER_CHUNK * np.maximum(chunks, 1)
    )
    together = (
        (span_ms <= MAX_SPAN_MS)
        & (span_ms <= MAX_SPAN_SHARE * e2e_ms)
        & (span_ms / (tokens - 1).clip(min=1) <= MAX_MS_PER_TOKEN)
    )
    held = eligible & token_events
    return eligible, held & together, held & ~together


def run_is_buffered(eligible: int, buffered: int, streamed: int = 0) -> bool:
    """The run's verdict: most of the requests that could be judged were buffered, and
    too few came token by token to show that the server streams (module docstring)."""
    streams = streamed >= max(STREAMED_MIN, STREAMED_SHARE * eligible)
    return eligible > 0 and buffered >= RUN_SHARE * eligible and not streams
