"""Interleaved 1F1B, ZB-H1 and ZB-V on real ranks: a schedule the checker refuses is refused by train.

The in-process tests (no MPI job): tests/unit/parallel/pipeline/test_interleaved_and_zero_bubble.py.
"""

from __future__ import annotations

import json

from tests.mpiutil import run_mpi
from tests.unit.parallel.pipeline.test_interleaved_and_zero_bubble import DEADLOCK


def test_cli_refuses_a_hand_made_deadlock_in_one_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([[[type(st).__name__, st.mb] for st in row] for row in DEADLOCK]))
    res = run_mpi(0, ["plan", "--pp", "2", "--microbatches", "1", "--schedule", str(path), "--show-schedule"])
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("simpar: error: ") and "deadlocks" in lines[0], res.stderr
    res = run_mpi(
        0, ["plan", "--pp", "4", "--microbatches", "6", "--schedule", "interleaved", "--show-schedule"]
    )
    assert res.returncode == 2 and "simpar: error:" in res.stderr


def test_show_schedule_zb_v_from_the_cli():
    res = run_mpi(0, ["plan", "--pp", "4", "--microbatches", "8", "--schedule", "zb-v", "--show-schedule"])
    assert res.returncode == 0, res.stderr
    grid = [line.split("|")[1].split() for line in res.stdout.splitlines() if line.startswith("stage ")]
    assert len(grid) == 4 and all(len(row) == 52 for row in grid)  # T = 52 = 6M + S - 1 + 1
    # Warm-up: stage s forwards its down chunk 2(S-s)-1 times, then the way back up (lower case) starts.
    assert grid[0][:8] == ["F0", "F1", "F2", "F3", "F4", "F5", "F6", "f0"]
    assert grid[3][:6] == [".", ".", ".", "F0", "f0", "F1"]  # the turn: f0 right after F0, same rank
    assert grid[0][-2:] == ["B7", "W7"]  # the last B pass is the first chunk's, on stage 0
    assert sum(row.count(".") for row in grid) == 4 * 52 - 4 * 6 * 8
    assert "1 - 6M/T, T = 52 (>= 6M+S-1 = 51): 4/52" in res.stdout and "8, 8, 8, 8" in res.stdout
