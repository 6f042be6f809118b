"""Telemetry: the CPU maths, DCGM mapping, the sampler's clock, a real busy process seen
from its own process tree, the NVML skip note, and the series stored with the run
(store blob, GPU summary fields) and read back."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import namedtuple

import pytest

from servetune.results.schema import RunResult, TelemetrySeries
from servetune.store import Store
from servetune.store.meta import server_summary
from servetune.telemetry import Sampler, summarize
from servetune.telemetry.gpu import open_gpu
from servetune.telemetry.host import HostSource, core_shares, local_server_pids, tree_delta
from servetune.telemetry.prom import map_exposition

CPU = namedtuple("CPU", "user nice system idle iowait irq softirq steal guest")


def test_core_shares_count_busy_and_steal_and_leave_guest_inside_user() -> None:
    a = CPU(100, 0, 50, 800, 50, 0, 0, 0, 0)
    b = CPU(160, 0, 70, 880, 60, 0, 0, 30, 40)  # 40 guest already inside user's +60
    busy, steal = core_shares(a, b)
    # deltas: user 60, system 20, idle 80, iowait 10, steal 30 -> total 200
    assert busy == pytest.approx(110 / 200)
    assert steal == pytest.approx(30 / 200)
    assert core_shares(a, a) == (0.0, 0.0)


def test_tree_delta_counts_only_processes_seen_twice() -> None:
    assert tree_delta({1: 5.0, 2: 1.0}, {1: 7.5, 3: 9.0}) == pytest.approx(2.5)


def test_dcgm_fields_map_to_the_nvml_names_combined_over_gpus() -> None:
    text = "\n".join(
        [
            "# TYPE DCGM_FI_DEV_FB_USED gauge",
            'DCGM_FI_DEV_FB_USED{gpu="0"} 1024',
            'DCGM_FI_DEV_FB_USED{gpu="1"} 3072',
            "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
            'DCGM_FI_DEV_GPU_UTIL{gpu="0"} 20',
            'DCGM_FI_DEV_GPU_UTIL{gpu="1"} 60',
            "# TYPE DCGM_FI_DEV_SM_CLOCK gauge",
            'DCGM_FI_DEV_SM_CLOCK{gpu="0"} 1980',
            'DCGM_FI_DEV_SM_CLOCK{gpu="1"} 1410',
            "# TYPE node_load1 gauge",
            "node_load1 3.5",
        ]
    )
    m = map_exposition(text + "\n")
    assert m["gpu_memory_used"] == 4096 * 2**20  # MiB summed, in bytes
    assert m["gpu_util"] == pytest.approx(0.4)  # mean of 20% and 60%
    assert m["gpu_sm_clock_mhz"] == 1410  # the slowest GPU
    assert m["gpu_count"] == 2
    assert m["url:node_load1"] == 3.5


class Counter:
    name = "fake"

    def __init__(self) -> None:
        self.n = 0

    def read(self) -> dict[str, float]:
        self.n += 1
        if self.n == 2:
            raise OSError("scrape failed")
        return {"n": float(self.n)}

    def close(self) -> None:
        pass


def test_sampler_stamps_the_run_clock_and_counts_failures() -> None:
    anchor = time.monotonic_ns()
    s = Sampler([Counter()], ["a note"], interval_s=0.05).start()
    # Wait for 3 of the thread's reads (the 2nd fails) rather than sleep a fixed time: a
    # starved CI process may not get them within any short sleep.
    deadline = time.monotonic() + 30
    while len(s.t_ns) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    series = s.stop(anchor)
    end = time.monotonic_ns() - anchor
    assert series.errors == 1 and series.notes == ["a note"] and series.sources == ["fake"]
    # On the run's clock: after the anchor, before stop returned, in order.
    assert len(series.t_ns) >= 4 and series.t_ns == sorted(series.t_ns)
    assert 0 <= series.t_ns[0] <= series.t_ns[-1] <= end
    # The thread's samples (all but stop's last) keep the interval; a stall only widens it.
    thread = series.t_ns[:-1]
    assert min(b - a for a, b in zip(thread, thread[1:], strict=False)) >= 0.049e9, thread
    assert series.sampler_cpu_s > 0
    assert series.deltas["n"] > 0  # last minus first


def test_host_source_sees_a_busy_process_tree_and_its_memory() -> None:
    import psutil

    code = "x = bytearray(64 << 20)\nprint('ready', flush=True)\nwhile True: pass"
    busy = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert busy.stdout is not None and busy.stdout.readline() == "ready\n"  # 64 MiB held
        spinner = psutil.Process(busy.pid)

        def cpu_s() -> float:
            t = spinner.cpu_times()
            return t.user + t.system

        src = HostSource(lambda: {busy.pid})
        t0 = time.monotonic()
        first = src.read()
        cpu0 = cpu_s()
        assert "engine_cpu_cores" not in first  # rates need two reads
        # A nice-19 spinner beside busy engines may get little CPU: wait until it has had
        # 0.3 s (psutil's own count) instead of assuming a share of a fixed sleep.
        deadline = time.monotonic() + 30
        while cpu_s() - cpu0 < 0.3 and time.monotonic() < deadline:
            time.sleep(0.05)
        cpu1 = cpu_s()
        v = src.read()
        t1 = time.monotonic()
    finally:
        busy.kill()
        busy.wait()
    assert cpu1 - cpu0 >= 0.3, "the spinner got no CPU in 30 s"
    # The source saw at least the CPU the spinner used between its two reads (over at most
    # t1 - t0 of wall time; 0.02 s: psutil's clock ticks), and no more than one core.
    assert v["engine_cpu_cores"] * (t1 - t0) >= cpu1 - cpu0 - 0.02, (v, cpu1 - cpu0, t1 - t0)
    assert v["engine_cpu_cores"] <= 1.1, v
    assert v["engine_rss_bytes"] > 64 << 20
    assert 0.0 <= v["host_cpu_busy"] <= 1.0 and v["host_cpu_cores"] >= 1
    assert 0.0 <= v["engine_runq_wait_share"] <= 1.0


def test_local_server_pids_finds_the_listener_and_not_a_remote_host() -> None:
    from servetune.engines.process import free_port

    assert local_server_pids("http://example.invalid:8000") is None
    port = free_port()
    code = (
        f"import socket, time; s = socket.socket(); s.bind(('127.0.0.1', {port}));"
        " s.listen(); time.sleep(30)"
    )
    srv = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(50):
            pids = local_server_pids(f"http://127.0.0.1:{port}/v1")
            if pids is not None:
                break
            time.sleep(0.1)
        assert pids is not None and srv.pid in pids()
    finally:
        srv.kill()
        srv.wait()


def test_no_gpu_is_a_note_not_an_error() -> None:
    src, why = open_gpu()
    if src is not None:
        pytest.skip("this host has a GPU: NVML is sampled (tested on the GPU machine)")
    assert why and why.startswith("GPU: ")


def gpu_series() -> TelemetrySeries:
    return TelemetrySeries(
        t_ns=[0, 1_000_000_000, 2_000_000_000],
        values=[
            {"gpu_memory_used": 40e9, "gpu_util": 0.50, "host_cpu_busy": 0.2},
            {"gpu_memory_used": 60e9, "gpu_util": 0.90, "host_cpu_busy": 0.4},
            {"gpu_memory_used": 50e9, "gpu_util": 0.70, "host_cpu_busy": 0.3},
        ],
        sources=["host", "nvml"],
    )


def test_store_keeps_telemetry_and_fills_gpu_fields(tmp_path) -> None:
    res = RunResult(id="r1", created_utc="2026-12-01T00:00:00", telemetry=gpu_series())
    with Store.open(f"sqlite:///{tmp_path / 's.db'}") as st:
        run_id = st.begin_run({"backend": "real"})
        st.finish_run(run_id, res)
        back = st.load_result(run_id)
        summary = st.get(run_id).result["server_summary"]
    assert back.telemetry is not None
    assert back.telemetry.series("gpu_util") == [0.5, 0.9, 0.7]
    assert summary["gpu_memory_used_max"] == 60e9
    assert summary["gpu_util_mean"] == pytest.approx(0.7)
    # no telemetry and no engine series: the fields stay empty, as before
    assert server_summary(None, None) == {}


def test_summarize_gives_peaks_and_means() -> None:
    s = summarize(gpu_series())
    assert s["gpu_util_max"] == 0.9 and s["host_cpu_busy_mean"] == pytest.approx(0.3)
    assert summarize(None) == {}


def test_report_draws_telemetry_beside_throughput_and_latency(tmp_path) -> None:
    pytest.importorskip("plotly")
    from servetune.report.data import load_report_data
    from servetune.report.telemetry_section import telemetry
    from synthetic_runs import synthetic_run

    with_tel, meta = synthetic_run(8, seed=1)
    end_ns = max(r.end_ns for r in with_tel.records)
    ts = list(range(0, end_ns, 1_000_000_000))
    with_tel.telemetry = TelemetrySeries(
        t_ns=ts,
        values=[{"engine_cpu_cores": 1.5, "host_cpu_busy": 0.9, "other_cpu_cores": 0.2}] * len(ts),
        notes=["GPU: no NVML on this host"],
    )
    bare, meta2 = synthetic_run(16, seed=2)
    with Store.open(f"sqlite:///{tmp_path / 's.db'}") as st:
        a = st.save_result(with_tel, meta)
        b = st.save_result(bare, meta2)
        chart = telemetry(load_report_data(st, [a]))
        empty = telemetry(load_report_data(st, [b]))
    names = [t.name for t in chart.fig.data]
    assert any(n.endswith("tok/s") for n in names) and any(n.endswith("TTFT") for n in names)
    assert any(n.endswith("engine") for n in names)
    assert not any("GPU" in n for n in names)  # no GPU series: its panels are left out
    assert "GPU: no NVML" in chart.note
    assert empty.fig is None and empty.note.startswith("No telemetry")


class FakeNVML:
    """A stand-in for pynvml with two GPUs (this host has none): the calls GpuSource makes,
    returning fixed figures, and two XID events pending."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    nvmlEventTypeXidCriticalError = 8

    def __init__(self) -> None:
        self.pending = 2

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlEventSetCreate(self):
        return "events"

    def nvmlDeviceRegisterEvents(self, h, kind, events):
        pass

    def nvmlDeviceGetMemoryInfo(self, h):
        return namedtuple("M", "used total")((10 + 10 * h) * 2**30, 80 * 2**30)

    def nvmlDeviceGetUtilizationRates(self, h):
        return namedtuple("U", "gpu memory")(40 + 40 * h, 30)

    def nvmlDeviceGetTemperature(self, h, kind):
        return 60 + 20 * h

    def nvmlDeviceGetPowerUsage(self, h):
        return 300_000

    def nvmlDeviceGetClockInfo(self, h, kind):
        return 1980 - 700 * h

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        return 1980

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x1 if h == 0 else 0x20  # GPU 0 idle, GPU 1 software thermal slowdown

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        return 0

    def nvmlEventSetWait(self, events, timeout_ms):
        if not self.pending:
            raise self.NVMLError("timeout")
        self.pending -= 1

    def nvmlEventSetFree(self, events):
        pass

    def nvmlShutdown(self):
        pass


def test_gpu_source_combines_gpus_and_counts_xids() -> None:
    from servetune.telemetry.gpu import GpuSource

    v = GpuSource(FakeNVML(), 2).read()
    assert v["gpu_memory_used"] == 30 * 2**30 and v["gpu_memory_total"] == 160 * 2**30
    assert v["gpu_util"] == pytest.approx(0.6)  # mean of 40% and 80%
    assert v["gpu_temp_c"] == 80 and v["gpu_power_w"] == 600
    assert v["gpu_sm_clock_mhz"] == 1280 and v["gpu_sm_clock_max_mhz"] == 1980
    assert v["gpu_throttled"] == 1.0  # thermal on GPU 1; GPU 0's idle reason does not count
    assert v["gpu_xid_total"] == 2


@pytest.mark.timeout(120)
def test_bench_stores_telemetry_with_the_server_tree_and_no_telemetry_turns_it_off(
    tmp_path, capsys
) -> None:
    """`servetune bench` against the mock in its own process: the run in the store carries
    a series whose engine tree is the process listening on the URL's port, plus the
    samples of the Prometheus endpoint given by --telemetry-url."""
    from cli_run import run_cli
    from servetune.engines.process import free_port

    port = free_port()
    cmd = [sys.executable, "-m", "servetune.cli.app", "mock-server", "--port", str(port)]
    mock = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    db = f"sqlite:///{tmp_path / 's.db'}"
    url = f"http://127.0.0.1:{port}"
    try:
        assert mock.stdout is not None and "listening" in mock.stdout.readline()
        args = ["bench", "--url", url, "--concurrency", "2", "--count", "30", "--db", db]
        # --telemetry-url: any Prometheus endpoint (here the mock's own /metrics)
        tel_url = ["--telemetry-url", f"{url}/metrics"]
        assert run_cli(capsys, *args, "--study", "on", *tel_url)[0] == 0
        assert run_cli(capsys, *args, "--study", "off", "--no-telemetry")[0] == 0
    finally:
        mock.kill()
        mock.wait()
    with Store.open(db) as st:
        on = st.load_result(st.resolve(["on"])[0])
        off = st.load_result(st.resolve(["off"])[0])
        summary = st.get(on.id).result["telemetry_summary"]
    assert off.telemetry is None
    assert on.telemetry is not None and on.telemetry.sources[0] == "host"
    assert "url" in on.telemetry.sources
    assert on.telemetry.series("url:mock:requests_total")[-1] >= 30
    assert on.telemetry.series("engine_rss_bytes"), on.telemetry.notes
    assert summary["host_cpu_busy_max"] <= 1.0
    # one clock: the samples span the requests' own time axis
    last_end = max(r.end_ns for r in on.records)
    # (5 s: a starved CI process may start the sampler or take its last sample late; a
    # series on another clock would be off by the host's uptime)
    assert on.telemetry.t_ns[0] <= on.records[0].send_ns + 5e9
    assert on.telemetry.t_ns[-1] >= last_end - 5e9
