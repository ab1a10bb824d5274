"""A decoder-only transformer (--arch gpt) in closed form: parameters, FLOPs, memory, time and MFU.
(`plan --arch gpt` puts them together for one layout: gpt_plan.py).

Notation: L blocks, hidden h, a heads, sequence s, vocabulary V, b sequences per micro-batch, B per
step (global), t tensor-parallel ranks, p pipeline stages. Sources, each formula written again here:

  parameters   simpar's model (gpt.py): L (12h^2 + 13h) + (V + s) h + 2h + V h (untied head, final LN);
               Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training on GPU Clusters
               Using Megatron-LM", sec. 5.1): 12 L h^2 (1 + 13/(12h) + (V + s)/(12 L h)), head tied
  FLOPs/step   two counts, which differ only in the attention's score products (q k^T and P v):
               model FLOPs (MFU's numerator, the same for every layout): the causal half of the scores,
               72 B s L h^2 (1 + s/(12h) + V/(12 L h)) -- Megatron-LM's num_floating_point_operations
               (megatron/training/training.py: "causal mask (only half of the mask is non-zero)"),
               as FlashAttention's benchmark counts a causal kernel (benchmark_flash_attention.py,
               flops() / 2 if causal). PaLM (Chowdhery et al. 2022, app. B: 6N + 12 L H Q T) and
               torchtitan (get_num_flop_per_token: "do not account for sparsity in causal attention")
               count the whole square; a kernel that skips the masked blocks (cp's ring) would then
               read above 100%.
               hardware FLOPs (what a run computes; time is priced from these): simpar's attention.py
               computes all s^2 scores and masks them, Narayanan et al. 2021, sec. 5.1's count
               72 B s L h^2 (1 + s/(6h) + V/(12 L h)); with full recomputation
               96 B s L h^2 (1 + s/(6h) + V/(16 L h)) -- simpar's matmuls are exactly these. cp's ring
               computes only its causal blocks (cp.py: ring_score_flops); a FlashAttention kernel
               (`plan --attention flash`) only the causal half, its backward rebuilding the scores
               (flash_flops_per_step).
  activations  Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer
               Models", Table 2), bytes per layer with 16-bit activations and 1-byte dropout masks:
                 no parallelism            s b h (34 + 5 a s / h)
                 tensor parallel           s b h (10 + 24/t + 5 a s / (h t))
                 tensor + sequence par.    s b h (34/t + 5 a s / (h t))
                 tp + selective recompute  s b h (10 + 24/t);  tp + sp + selective  s b h 34/t
                 full recomputation        2 s b h (the layer's input only)
               --attention flash: no s^2 term at all, whatever the recomputation (FlashAttention, Dao et
               al. 2022, sec. 3.1: the scores never reach memory; the backward rebuilds them from each
               row's log-sum-exp, 4 bytes per row and head: s b h 4a/(h t)) -- the selective rows' bytes
               without recomputing anything.
               simpar's own block has no dropout: it keeps 16 s h + a s^2 + 2 s ELEMENTS per sequence
               (LN1's xh, the attention input, q, k, v, P, the heads' output o, LN2's xh, the MLP
               input, W1's output and GELU's; each LayerNorm's 1/sigma per token). In 16-bit that is
               32 sbh + 2 a s^2 b + 4 sb: Korthikanti's 34 sbh + 5 a s^2 b less the two sbh dropout
               masks, the a s^2 b attention-dropout mask and its 2 a s^2 b output, plus the row stats.
  optimizer    ZeRO (Rajbhandari et al. 2020, sec. 3.1 and 5): (2 + 2 + K) bytes per parameter,
               K = 12 for mixed-precision Adam; ZeRO-1/2/3 divide the optimizer / + grads / + params by dp
  MFU          model FLOPs (the causal count: recomputation and masked scores are not useful work) /
               (step time x devices x
               peak), PaLM's definition (Chowdhery et al. 2022, appendix B); the peak is the profile's
               datasheet dense rate (gpus.py: H100 BF16 989.4 TFLOP/s), while its time uses the
               achievable GEMM rate (80.3% of that on H100, the MAMF table), so MFU stays below it.

Nothing here imports the runtime, the model, parallel/, collectives/ or kernels/: predict_run writes
simpar's own rules down again (units, ring chunks, gradient buckets, what each unit keeps) so that a
run's ledger and memory are compared with formulas, not with themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import layout_name
from .collectives import ALLREDUCE, Cost, chunk, ring_allgather, ring_reduce_scatter, to_bytes
from .spec import PRECISIONS, dp_buckets, precision_of, split


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    source: str = ""


# Published shapes. GPT-3: Brown et al. 2020, "Language Models are Few-Shot Learners", Table 2.1
# (n_layers, d_model, n_heads, n_ctx 2048); its vocabulary is GPT-2's byte-level BPE of 50257 tokens
# (sec. 2.1 uses GPT-2's tokenizer; Megatron pads it to 51200). 13B's d_model 5140 is the table's own
# number (40 heads x d_head 128 would be 5120; the paper prints both). GPT-2 1.5B: Radford et al.
# 2019, "Language Models are Unsupervised Multitask Learners", Table 2 (48 layers, d_model 1600) and
# sec. 2.3 (context 1024, vocabulary 50257); its 25 heads (d_head 64) are from OpenAI's released
# hparams.json for that model, the paper does not print them.
PRESETS = {
    "gpt3-175b": Shape(96, 12288, 96, 2048, 50257, "Brown et al. 2020, Table 2.1 (GPT-3 175B)"),
    "gpt3-13b": Shape(40, 5140, 40, 2048, 50257, "Brown et al. 2020, Table 2.1 (GPT-3 13B)"),
    "gpt2-1.5b": Shape(48, 1600, 25, 1024, 50257, "Radford et al. 2019, Table 2; heads: released hparams"),
}


# -- parameters and FLOPs ------------------------------------------------------------------------------


def block_params(h: int) -> int:
    """LayerNorms 4h, Wq Wk Wv Wo and biases 4h^2 + 4h, MLP 8h^2 + 5h."""
    return 12 * h * h + 13 * h


def unit_sizes(L: int, h: int, s: int, V: int) -> list[int]:
    """simpar's units in order: embedding (V + s) h, L blocks, head 2h + h V (untied, final LN)."""
    return [(V + s) * h] + [block_params(h)] * L + [2 * h + h * V]


def param_count(L: int, h: int, s: int, V: int, tied: bool = False) -> int:
    """simpar's model; tied=True drops the head's V h (GPT-2/3 reuse the embedding there)."""
    return sum(unit_sizes(L, h, s, V)) - (V * h if tied else 0)


def narayanan_params(L: int, h: int, s: int, V: int) -> float:
    """Narayanan et al. 2021, sec. 5.1: tied head, biases and LayerNorms of the blocks, no final LN."""
    return 12 * L * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * L * h))


def model_flops_per_step(B: int, s: int, L: int, h: int, V: int) -> float:
    """The model's useful FLOPs per step, MFU's numerator (module docstring): Narayanan's count with
    only the causal half of the score products, 72 B s L h^2 (1 + s/12h + V/12Lh). Per sequence and
    block forward: q, k, v, o 8 s h^2, the MLP 16 s h^2, q k^T and P v over the s^2/2 scores a token
    may see 2 s^2 h; the head 2 s h V; backward twice the forward."""
    return 72 * B * s * L * h * h * (1 + s / (12 * h) + V / (12 * L * h))


def flops_per_step(B: int, s: int, L: int, h: int, V: int, recompute: str = "none") -> float:
    """The hardware's FLOPs when every score is computed and masked, as simpar's attention.py does
    (model_flops_per_step counts half of them). Narayanan et al. 2021, sec. 5.1: 72 B s L h^2
    (1 + s/6h + V/12Lh); full recomputation runs each
    block's forward again (the head's is not recomputed): 96 B s L h^2 (1 + s/6h + V/16Lh); selective
    (Korthikanti et al. 2022, sec. 4.2, as simpar rebuilds P from q and k): + 2 B L s^2 h."""
    if recompute == "full":
        return 96 * B * s * L * h * h * (1 + s / (6 * h) + V / (16 * L * h))
    model = 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))
    if recompute == "selective":  # q k^T again, 2 s^2 h per sequence and block (o is kept: no P v)
        return model + 2 * B * L * s * s * h
    return model


# -- activation memory per layer -----------------------------------------------------------------------


def korthikanti_layer_bytes(
    s: int, b: int, h: int, a: int, t: int = 1, sp: bool = False, recompute: str = "none", flash: bool = False
) -> float:
    """Korthikanti et al. 2022, Table 2 (16-bit activations, with dropout), bytes per layer per GPU;
    `flash`: the scores never stored, each row's float32 log-sum-exp instead (module docstring)."""
    if recompute == "full":  # the table's last row: only the layer's 16-bit input, whatever t and sp
        return 2 * s * b * h
    attention = 4 * a / (h * t) if flash else 0 if recompute == "selective" else 5 * a * s / (h * t)
    rest = 34 / t if sp else 10 + 24 / t
    return s * b * h * (rest + attention)


def simpar_block_elems(s: int, b: int, h: int, a: int) -> int:
    """Elements simpar's block keeps for backward (module docstring): 16 sbh + a s^2 b + 2 sb."""
    return 16 * s * b * h + a * s * s * b + 2 * s * b


def simpar_activation_bytes(b: int, s: int, L: int, h: int, a: int, V: int, bpe: int) -> int:
    """Everything a serial/dp/ZeRO rank keeps for b sequences: the embedding's int64 tokens, L blocks,
    the head's LN xh, 1/sigma and LN output (2 sbh + sb). Logits are the loss's input, not kept."""
    return 8 * s * b + L * simpar_block_elems(s, b, h, a) * bpe + (2 * s * b * h + s * b) * bpe


# -- a simpar run's prediction, keyed like its metrics (predict.predict_from_config) -------------------


def rank_record(rank: int, coords: dict, **categories: dict) -> dict:
    """One rank's predicted traffic keyed as the ledger writes it into the metrics: per category
    (model=..., activation=...: each a {op: Cost} of totals over the run) the bytes sent and messages,
    and every op under "category/op". The gpt and cp predictors all report a rank this way."""
    return {
        "rank": rank,
        "coords": coords,
        "sent": {"data": 0} | {cat: sum(c.sent for c in ops.values()) for cat, ops in categories.items()},
        "messages": {"data": 0}
        | {cat: sum(c.messages for c in ops.values()) for cat, ops in categories.items()},
        "by_op": {
            f"{cat}/{op}": {"sent": c.sent, "messages": c.messages}
            for cat, ops in categories.items()
            for op, c in ops.items()
        },
    }


def run_result(cfg, hw, steps: int, ranks: list, memory: list, params: int, time: tuple, **extra) -> dict:
    """A gpt or cp run's prediction, keyed like its metrics (predict.predict_from_config): the ranks'
    records (rank_record) with the per-step totals and per-rank maxima, memory per rank and its max,
    the model's FLOPs per step (model_flops_per_step; the hardware's, recomputation included, where
    the ranks carry "flops"), and `time` = (step_s, compute_s, comm_s per step). `extra`: bubble,
    stage_units."""
    step_s, compute_s, comm_s = time
    per, cats = max(steps, 1), ("data", "model", "activation")
    if all("flops" in r for r in ranks):
        extra["hardware_flops_per_step"] = sum(
            r["flops"]["forward"] + r["flops"]["backward"] + r["flops"]["recompute"] for r in ranks
        )
    return {
        "steps": steps,
        "layout": layout_name(cfg),
        "hardware": getattr(hw, "name", None),
        "comm": {
            "ranks": ranks,
            "per_step": {k: sum(r["sent"][k] for r in ranks) / per for k in cats},
            "per_rank_per_step_max": {k: max(r["sent"][k] for r in ranks) / per for k in cats},
        },
        "memory": {"ranks": memory, "max": {k: max(m[k] for m in memory) for k in memory[0]}},
        "bubble": 0.0,
        "params": params,
        "flops_per_step": model_flops_per_step(cfg.batch, cfg.seq_len, cfg.blocks, cfg.hidden, cfg.vocab),
        "time": {
            "step_s": step_s,
            "compute_s": compute_s,
            "comm_s": comm_s,
            "samples_per_s": cfg.batch / step_s if step_s > 0 else float("inf"),
        },
    } | extra


def predict_run(cfg, world_size: int, steps: int, hw) -> dict:
    """Per-rank bytes (totals over `steps`), memory and a step time of `simpar train --arch gpt` (serial,
    --dp, --zero 1-3): parallel/data.py's buckets and parallel/zero.py's per-unit chunks, written again.
    --tp (and --sp): gpt_tp.py (predict.py picks); --pp: gpt_pipeline.py."""
    L, h, a, s, V = cfg.blocks, cfg.hidden, cfg.heads, cfg.seq_len, cfg.vocab
    p = cfg.dp if cfg.dp is not None else world_size
    prec = PRECISIONS[precision_of(cfg)]
    sizes = unit_sizes(L, h, s, V)
    P = sum(sizes)
    opt_bpp = prec.optimizer[(cfg.optimizer, bool(cfg.momentum))]
    ranks, memory, comm_s = [], [], 0.0
    for d in range(p):
        ops: dict[str, Cost] = {}

        def add(op: str, cost: Cost, bpe: int, times: int = 1) -> None:
            if cost.messages:
                ops[op] = ops.get(op, Cost()) + to_bytes(cost, bpe, times * steps)

        if cfg.zero == 0:
            for n in dp_buckets(sizes, prec.grad, cfg.bucket_mb):
                add("grad-allreduce", ALLREDUCE[cfg.collectives](n, p, d), prec.grad)
            mem = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": P * opt_bpp}
        elif cfg.zero == 1:
            add("grad-reduce-scatter", ring_reduce_scatter(P, p, d), prec.grad)
            add("param-all-gather", ring_allgather(P, p, d), prec.param)
            mem = {"params": P * prec.param, "grads": P * prec.grad, "optimizer": chunk(P, p, d) * opt_bpp}
        else:
            K = cfg.grad_accum
            passes = 1 if cfg.zero == 2 else K
            for n in sizes:
                add("grad-reduce-scatter", ring_reduce_scatter(n, p, d), prec.grad, passes)
                add("param-all-gather", ring_allgather(n, p, d), prec.param, 1 if cfg.zero == 2 else 2 * K)
            S_r, n_max = sum(chunk(n, p, d) for n in sizes), max(sizes)
            held = P if cfg.zero == 2 and K > 1 else n_max
            mem = {
                "params": (P if cfg.zero == 2 else S_r + n_max) * prec.param,
                "grads": (S_r + held) * prec.grad,
                "optimizer": S_r * opt_bpp,
            }
        rows = max(chunk(k_rows, p, d) for k_rows in split(cfg.batch, cfg.grad_accum))
        mem["activations_peak"] = simpar_activation_bytes(rows, s, L, h, a, V, prec.act)
        memory.append(mem)
        if hw is not None and p > 1:
            from .hardware import group_link

            link = group_link(hw, "dp", p, 1, 1)
            comm_s = max(comm_s, sum(c.rounds * link.alpha + c.round_elems * link.beta for c in ops.values()))
        ranks.append(rank_record(d, {"pp": 0, "dp": d, "tp": 0}, model=ops, activation={}))
    if hw is not None:  # as the simulated clock charges a step
        from .gpt_time import step_seconds
        from .gpt_zero_time import zero_step_seconds

        timed = (zero_step_seconds if cfg.zero else step_seconds)(
            cfg, p, sizes, hw, precision_of(cfg), prec.act
        )
        step_s, compute_s, comm_s = timed["step_s"], timed["compute_s"], timed["comm_s"] * max(steps, 1)
    else:
        rows = max(chunk(cfg.batch, p, d) for d in range(p))
        rate = hw.flop_rate(precision_of(cfg)) if hw is not None else 0.0
        compute_s = flops_per_step(rows, s, L, h, V) / rate if rate else 0.0
        step_s = compute_s + comm_s / max(steps, 1)
    return run_result(cfg, hw, steps, ranks, memory, P, (step_s, compute_s, comm_s / max(steps, 1)))
