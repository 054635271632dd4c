"""``iolstream bench --suite memory``: the memory of what waits in the stream logic, per waiting item.

Two floods of one-row messages into a ``StreamProcessor`` in this machine's memory (no broker),
small config (k=10, m=10, N=128, L=4, b=256), the default stream bounds:

- ``labels``: N label messages whose rows never come: the early-label store fills to
  ``max_early_labels`` and then pushes its oldest out (``unknown_id`` dead letters);
- ``rows``: N feature messages whose labels never come: the pending rows fill to
  ``max_pending_rows`` and then the oldest are evicted.

Each flood runs in a fresh process twice: once for the RSS (``/proc/self/statm``, sampled every
10,000 messages for the peak) and once under ``tracemalloc`` (which inflates the RSS itself).
After 100k, 300k and 600k messages (the store is at its bound from the first mark on) it reports
the growth over the process before the flood, divided by the items waiting: bytes per waiting
item. For rows the feature cache (``stream.FEATURE_CACHE_BYTES``, its own bound and its own row
of the memory table in docs/operations.md) is taken out of the traced figure. ``drained``: the same after the
store emptied (ttl), what the process keeps of the flood.

Ids are ``label-<i>`` / ``row-<i>`` (7–12 characters); an id costs 49 bytes + its length as a str.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

MARKS = (100_000, 300_000, 600_000)
SAMPLE_EVERY = 10_000


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _processor():
    from iolstream.core.model import EdRVFL, ModelConfig
    from iolstream.stream.config import StreamConfig
    from iolstream.stream.processor import StreamProcessor

    model = EdRVFL(ModelConfig(n_inputs=10, classes=tuple(range(10)), n_nodes=128, n_layers=4, scaler="none"))
    return StreamProcessor(model, StreamConfig(batch_rows=256, max_batch_latency_ms=10))


def flood(kind: str, n: int, trace: bool) -> dict:
    """One flood of ``n`` messages of ``kind`` ("labels" or "rows") in this process; growth at each mark."""
    import tracemalloc

    if kind not in ("labels", "rows"):
        raise ValueError(f"kind must be 'labels' or 'rows', got {kind!r}")
    proc = _processor()
    # every code path once (kernels compiled, codec warm) before the baseline
    proc.on_labels(b'{"id": "warm-label", "y": 1}', ("labels", 0, 0), now_ms=0)
    proc.on_features(b'{"id": "warm-row", "x": [0,1,2,3,4,5,6,7,8,9]}', ("features", 0, 0), now_ms=0)
    proc.step(now_ms=1, force=True)
    proc.step(now_ms=10**7)  # both expire: the stores are empty again
    gc.collect()
    if trace:
        tracemalloc.start(1)
    rss0, traced0 = _rss(), (tracemalloc.get_traced_memory()[0] if trace else 0)
    peak_rss = rss0
    now = 10**7
    x = b"[0.5,1.5,2,3,4,5,6,7,8,9]"
    marks = []
    for i in range(n):
        if kind == "labels":
            proc.on_labels(b'{"id": "label-%d", "y": %d}' % (i, i % 10), ("labels", 0, i), now_ms=now)
        else:
            proc.on_features(b'{"id": "row-%d", "x": %s}' % (i, x), ("features", 0, i), now_ms=now)
            if (i + 1) % 256 == 0:
                proc.step(now_ms=now)
        if (i + 1) % SAMPLE_EVERY == 0:
            peak_rss = max(peak_rss, _rss())
        if i + 1 in MARKS or i + 1 == n:
            gc.collect()
            marks.append(_mark(proc, i + 1, rss0, traced0, peak_rss, trace))
    # drain: everything waiting expires (rows: row_ttl_ms; labels: early_label_ttl_ms)
    now += 10 * 3_600_000
    proc.step(now_ms=now, force=True)
    gc.collect()
    drained = _mark(proc, n, rss0, traced0, peak_rss, trace)
    return {"kind": kind, "trace": trace, "marks": marks, "drained": drained}


def _mark(proc, messages: int, rss0: int, traced0: int, peak_rss: int, trace: bool) -> dict:
    import tracemalloc

    waiting = proc.join.n_early if proc.join.n_early > len(proc.join) else len(proc.join)
    out = {
        "messages": messages,
        "waiting": waiting,
        "pending": len(proc.join),
        "early": proc.join.n_early,
        "rss_mb": (_rss() - rss0) / 1e6,
        "peak_rss_mb": (peak_rss - rss0) / 1e6,
    }
    if trace:
        current, peak = tracemalloc.get_traced_memory()
        out["traced_mb"] = (current - traced0) / 1e6
        out["traced_peak_mb"] = (peak - traced0) / 1e6
        out["feature_cache_mb"] = proc.feature_cache.bytes / 1e6
    item = max(waiting, 1)
    rest = proc.feature_cache.bytes if trace else 0
    out["rss_bytes_per_item"] = (_rss() - rss0) / item
    if trace:
        out["traced_bytes_per_item"] = (current - traced0 - rest) / item
    return out


def _child(kind: str, n: int, trace: bool) -> dict:
    cmd = [sys.executable, "-m", "iolstream.tools.bench_memory", kind, str(n)] + (
        ["--trace"] if trace else []
    )
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"memory flood {kind} {n} (trace={trace}) failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_memory(args) -> dict:
    """Both floods, each in its own processes (RSS, then tracemalloc); a summary line per mark unless
    --json."""
    n = args.memory_messages
    out = {
        "suite": "memory",
        "messages": n,
        "config": "small (k=10, m=10, N=128, L=4, b=256), default bounds",
        "floods": {},
    }
    for kind in ("labels", "rows"):
        rss, traced = _child(kind, n, False), _child(kind, n, True)
        out["floods"][kind] = {"rss": rss, "traced": traced}
        if not args.json:
            for a, b in zip(rss["marks"] + [rss["drained"]], traced["marks"] + [traced["drained"]]):
                tag = "drained" if a is rss["drained"] else f"{a['messages']:>7d}"
                print(
                    f"{kind:6s} {tag:>7s}  waiting {a['waiting']:>7d}  RSS +{a['rss_mb']:6.1f} MB"
                    f" (peak +{a['peak_rss_mb']:6.1f})  {a['rss_bytes_per_item']:6.0f} B/item  traced +{b['traced_mb']:6.1f} MB"
                    f" (peak +{b['traced_peak_mb']:6.1f}, cache {b['feature_cache_mb']:5.1f})"
                    f"  {b['traced_bytes_per_item']:6.0f} B/item",
                    file=sys.stderr,
                    flush=True,
                )
    return out


if __name__ == "__main__":
    kind_arg, n_arg = sys.argv[1], int(sys.argv[2])
    print(json.dumps(flood(kind_arg, n_arg, "--trace" in sys.argv[3:])))
