"""Random option combinations, each trained for 2 steps on 4 real ranks: every one must either train or
end with exactly one `simpar: error:` line and exit status 2 (no traceback, no hang, no "unexpected").

    python tests/mpi/scripts/option_sweep.py [SEED] [DRAWS]        # e.g. 7 60: about 3 minutes on 2 cores

Not part of the suite (too slow for CI); tests/mpi/cli/test_fuzz_cli.py is the in-suite, Hypothesis-driven
version over single options. Prints one line per draw and marks any bad ending with "<-- BAD".
"""

import random
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from simpar.run.launch import run  # noqa: E402

random.seed(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
choices = {
    "--arch": ["mlp", "resmlp"],
    "--tp": ["1", "2"],
    "--pp": ["1", "2"],
    "--zero": ["0", "1", "3"],
    "--sp": [None, ""],
    "--experts": [None, "4"],
    "--ep": [None, "2"],
    "--alltoall": [None, "bruck"],
    "--precision": ["fp32", "mixed-fp16", "mixed-bf16"],
    "--schedule": ["1f1b", "gpipe", "zb-h1", "zb-v", "interleaved"],
    "--recompute": ["none", "full", "selective"],
    "--grad-accum": ["1", "2"],
    "--optimizer": ["sgd", "adam"],
    "--collectives": ["ring", "tree", "mpi"],
    "--data-source": ["local", "root"],
    "--checkpoint": [None, "yes"],
    "--clock": ["wall", "sim"],
}
N = int(sys.argv[2]) if len(sys.argv) > 2 else 40
for trial in range(N):
    keys = random.sample(sorted(choices), random.randint(2, 4))
    pick = {k: random.choice(choices[k]) for k in keys}
    args = [
        "train",
        "--steps",
        "2",
        "--batch",
        "32",
        "--microbatches",
        "2",
        "--layers",
        "64,64,64,64,10",
        "--watchdog",
        "60",
    ]
    fixed = len(args)
    tmp = tempfile.mkdtemp()
    for k, v in pick.items():
        if v is None:
            continue
        if k == "--checkpoint":
            args += ["--checkpoint-dir", tmp, "--checkpoint-every", "1"]
        elif k == "--clock":
            args += ["--clock", v] + (["--hardware", "dgx-h100"] if v == "sim" else [])
        elif v == "":
            args.append(k)
        else:
            args += [k, v]
    res = run(4, args, timeout=120)
    err = res.stderr or ""
    ok = res.returncode == 0 or (
        res.returncode == 2 and err.count("simpar: error:") == 1 and "Traceback" not in err
    )
    line = [x for x in err.splitlines() if "simpar: error" in x]
    flag = "" if ok else "  <-- BAD"
    if "unexpected" in err:
        flag += "  <-- UNEXPECTED"
    print(res.returncode, " ".join(args[fixed:]), "|", line[0][:200] if line else "", flag, flush=True)
