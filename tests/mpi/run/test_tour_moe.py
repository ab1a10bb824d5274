"""The tour with --experts: the layouts `train` runs for a mixture of experts, each against serial.

In-process: which layouts the tour offers for E experts on n ranks (config.validate decides). One MPI
tour (4 ranks, 3 steps, float64) checks that every offered layout computes the serial model (losses to
1e-12, the same tokens kept and dropped), and holds the all-to-all and gradient bytes in its metrics --
and the table's a2a/step column -- to closed forms written here from the run's routing counts. A bad
router option is one error line.
"""

from __future__ import annotations

import json
import math

import numpy as np

from simpar.run.launch import run
from simpar.units import fmt_bytes
from tests.mpi.model.test_moe import kept_from_routed
from tests.mpi.test_errors import assert_one_line_error

E, K, C, B, STEPS = 4, 2, 1.0, 64, 3
# d_in != d_out in both MoE layers (1: 96 -> 128, 2: 128 -> 80), so a width swapped in an op shows
LAYERS = [64, 96, 128, 80, 10]
MOE_LAYERS = [(96, 128), (128, 80)]


def alltoall_rows(routed_by_rank, D, P, d):
    """Rows rank d sends per MoE layer, summed over steps: (out, back). out = its rows kept by experts
    on the other ranks of its ep group (ep-dispatch d_in wide, ep-combine-grad d_out wide); back = the
    rows its own experts kept for the group's other ranks (ep-combine d_out, ep-dispatch-grad d_in)."""
    cap = math.ceil(C * K * B / E)  # global capacity: the batch's rows, whatever the layout
    mine = set(range((d % P) * E // P, (d % P + 1) * E // P))
    group = range(d - d % P, d - d % P + P)
    out, back = [0] * len(MOE_LAYERS), [0] * len(MOE_LAYERS)
    for step in routed_by_rank:
        for i, H in enumerate(step):
            kept = kept_from_routed(H, cap)
            out[i] += sum(kept[d][e] for e in range(E) if e not in mine)
            back[i] += sum(kept[s][e] for s in group if s != d for e in mine)
    return out, back


def test_moe_tour_matches_serial_and_alltoall_bytes(tmp_path):
    out = tmp_path / "tour"
    args = ["tour", "--quick", "--experts", str(E), "--top-k", str(K), "--capacity-factor", str(C)]
    args += ["--layers", ",".join(map(str, LAYERS)), "--steps", str(STEPS), "--out", str(out)]
    res = run(4, args, timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    layouts = {"serial": (1, 1), "dp4": (4, 1), "dp4xep2": (4, 2), "dp4xep4": (4, 4)}  # name: (D, P)
    assert "simpar tour: 4 layouts, same model and data, 3 steps, float64" in res.stdout
    assert "a2a/step" in res.stdout and "!" not in res.stdout.split("simpar tour:")[1].split("(a2a")[0]
    for png in ("comm_by_layout.png", "comm_scaling.png", "memory_by_layout.png"):
        assert (out / png).stat().st_size > 0, png
    metrics = {name: json.loads((out / f"{name}.json").read_text()) for name in layouts}
    ref = metrics["serial"]
    assert sum(map(sum, ref["moe"]["dropped"])) > 0  # capacity binds, so its rule is exercised
    bpe = 8
    dense = LAYERS[0] * LAYERS[1] + LAYERS[1] + LAYERS[3] * LAYERS[4] + LAYERS[4]  # first and last layer
    dense += sum(d_in * E for d_in, _ in MOE_LAYERS)  # the routers
    expert = sum(d_in * d_out + d_out for d_in, d_out in MOE_LAYERS)  # one expert of each MoE layer
    assert ref["params"] == dense + E * expert
    table = res.stdout.split("simpar tour:")[1].splitlines()
    column = table[1].index("a2a/step") + len("a2a/step")  # right-aligned, 10 wide
    a2a_cell = {line.split()[0]: line[column - 10 : column].strip() for line in table[3:7]}
    for name, (D, P) in layouts.items():
        m = metrics[name]
        assert (m["world_size"], m["config"]["ep"]) == (D, P), name
        # the same model: every step's loss, and the same tokens kept and dropped as serial
        np.testing.assert_allclose(m["losses"], ref["losses"], rtol=1e-12, atol=0, err_msg=name)
        assert m["moe"]["tokens_per_expert"] == ref["moe"]["tokens_per_expert"], name
        assert m["moe"]["dropped"] == ref["moe"]["dropped"], name
        assert m["prediction_mismatches"] == [], name
        # gradients: non-expert ring all-reduce over dp, each expert's over its D/P expert-dp ranks
        model = 2 * (D - 1) * dense + 2 * (D // P - 1) * E * expert
        assert m["comm"]["total_sent"]["model"] == model * bpe * STEPS, name
        a2a = 0
        for d, rank in enumerate(m["comm"]["ranks"]):
            out_rows, back_rows = alltoall_rows(m["moe"]["routed_by_rank"], D, P, d)
            widths = zip(out_rows, back_rows, MOE_LAYERS)
            expected = {"ep-dispatch": 0, "ep-combine-grad": 0, "ep-combine": 0, "ep-dispatch-grad": 0}
            for o, b, (d_in, d_out) in widths:
                expected["ep-dispatch"] += o * d_in * bpe
                expected["ep-combine-grad"] += o * d_out * bpe
                expected["ep-combine"] += b * d_out * bpe
                expected["ep-dispatch-grad"] += b * d_in * bpe
            for op, sent in expected.items():
                assert rank["by_op"].get(f"activation/{op}", {"sent": 0})["sent"] == sent, (name, d, op)
            assert rank["sent"]["activation"] == sum(expected.values()), (name, d)  # nothing else
            a2a += sum(expected.values())
        assert (a2a > 0) == (P > 1), name  # dp4 keeps every expert on every rank: no all-to-all
        # the table's a2a/step column: all ranks' all-to-all bytes per step
        assert a2a_cell[name] == fmt_bytes(a2a / STEPS), (name, a2a_cell)


def test_moe_tour_bad_router_option_is_one_line():
    """The tour checks --experts and its router options with train's rules: one line, every rank ends."""
    res = run(2, ["tour", "--quick", "--experts", "3", "--top-k", "4"], timeout=30)
    assert_one_line_error(res, "serial: --top-k must be between 1 and --experts 3, got 4")
