"""The benchmark's quick mode runs in CI so it cannot rot. It asserts that every number was
produced (never how fast: performance goals live in the benchmark's own output)."""
import json
import math
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_quick_benchmark_produces_every_number(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--json", str(out)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    print(proc.stdout)
    results = json.loads(out.read_text())
    assert len(results["workloads"]) == 4
    for row in results["workloads"].values():
        for key in ("plain_ms", "capture_x", "diagnose_x", "anomaly_x"):
            assert math.isfinite(row[key]) and row[key] > 0
        assert row["torchviz"].endswith("x") or row["torchviz"].startswith("failed")
    assert [r["nodes"] for r in results["scale"]] == [1001, 10001]
    assert results["memory"]["retained_tensors"] == 0
    assert "one training step" in proc.stdout and "memory" in proc.stdout
