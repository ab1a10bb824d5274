"""The cost model: closed-form bytes, messages, memory and time of one training step, per rank.

An independent witness. Nothing here runs MPI, and nothing here calls the code that moves bytes or
schedules work (collectives/, parallel/): every rule simpar follows -- how chunks are cut, which
layers a pipeline stage gets, how long a stage keeps activations alive -- is written down again here
as a formula. So when the execution code changes its behaviour, `mismatches` reports it.

  collectives.py  what one rank sends in one collective (ring, Rabenseifner, tree, PS, MPI)
  spec.py         the question (Spec, precisions, check) and how simpar cuts it up (shards, buckets, rows)
  stages.py       which layers each pipeline stage gets (the balanced split, by bisection)
  order.py        a pipeline rank's order of work (each schedule) and the activations it keeps alive
  rank.py         one rank's step: bytes, messages, memory, FLOPs (predict_rank)
  work.py         what each layer's compute costs per row and per call (FLOPs, memory-bound elements)
  passes.py       the memory passes each kernel backend's layer and optimizer calls make (per backend)
  resblocks.py    --arch resmlp's units, and their tensor/sequence-parallel rules, in closed form
  moe.py          mixture of experts with expert parallelism: all-to-all rows, memory, time
  chunktime.py    the seconds of one rank's work on one model chunk (the alpha-beta-gamma model)
  steptime.py     those pieces in a schedule's order: one step's time as max-plus recurrences
  rounds_time.py  a dp group's gradient buckets, every rank through every round of its algorithm
  predict.py      the time model, the whole prediction (predict) and the comparison with a run
                  (predict_from_config, mismatches)
  hardware.py     hardware profiles (local, dgx-h100, h200, dgx-a100, ib-cluster, ethernet-100g,
                  FILE.json) and links
  gpus.py         every number of the GPU presets, each with its source
  nccl.py         a collective as NCCL runs it (protocols, NVLink SHARP, rails), a GEMM by its shape:
                  plain arithmetic the simulated clock and `simpar validate` call too
  compare.py      rank every layout of N ranks (`plan --compare`) and explain the winner

No printing and no command line here: `simpar plan` (cli/plan.py) is the front end.
"""

from .collectives import (  # noqa: F401
    ALLREDUCE,
    Cost,
    chunk,
    chunk_offset,
    mpi_allreduce,
    ps_allreduce,
    rabenseifner_allreduce,
    ring_allgather,
    ring_allreduce,
    ring_reduce_scatter,
    to_bytes,
    tree_allreduce,
)
from .predict import bubble_formula, bubble_fraction, mismatches, op_time, predict, predict_from_config  # noqa: F401
from .rank import CATS, MEMORY_KINDS, Book, alive_window, peak_alive_rows, predict_rank  # noqa: F401
from .spec import (  # noqa: F401
    DTYPE_PRECISION,
    PRECISIONS,
    Precision,
    Shape,
    Spec,
    check,
    coords_of,
    dp_buckets,
    layer_flops,
    local_layer_size,
    micro_rows,
    split,
    tp_kinds,
)
from .stages import balanced_counts, stage_bounds  # noqa: F401
