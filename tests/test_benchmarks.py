"""The GPU benchmark script runs end to end in its CPU mode, so that a
session lent a GPU spends its minutes measuring, not debugging the script."""

import subprocess
import sys

from conftest import ROOT


def test_gpu_benchmark_runs_in_its_tiny_cpu_mode():
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--size", "tiny", "--sequences", "16",
         "--train-steps", "2"],
        capture_output=True, text=True, timeout=300, check=True,
    ).stdout
    lines = {line.split()[0]: line for line in out.splitlines() if "tokens/s" in line}
    assert set(lines) == {"scoring", "decode", "decode+prompt", "LoRA"}, out
    assert all(" 0 tokens in" not in line for line in lines.values()), out
