"""Activation recomputation (--recompute full | selective): hold less between forward and backward.

A stage's forward keeps, per layer, a Context (input x, pre-activation z, output y) until its
backward. With recomputation the forward keeps less and the backward first rebuilds the rest:

  none       keep every Context: x and z of each layer (y is the next layer's x)
  full       keep only the chunk's input; the backward re-runs the chunk's forward from it (Chen et
             al. 2016, "Training deep nets with sublinear memory cost"): one more forward of FLOPs,
             and with tensor parallelism its g all-reduces once more
  selective  keep the chunk's input and every matmul output z; the backward recomputes the cheap
             elementwise part, y = act(z) (= the next layer's x), 2 bytes moved per element
             (Korthikanti et al. 2022, "Reducing activation recomputation", sec. 4.2 keeps the
             expensive parts and recomputes the cheap ones; in an MLP that is the activation;
             in a chunk of resmlp units LayerNorm and the activation: resstack.save_selective;
             in gpt's blocks the attention's softmax output P, the s^2 part: gpt_recompute.py)

What the rank's meter holds (the metrics' activations_peak, predicted by costmodel/rank.py): `held`
bytes from the forward to the backward; during the backward the rebuilt Contexts in full, `held`
counted in them (the kept x and z are the same arrays). The numbers are recomputed exactly as the
forward computed them, so every layout still equals the serial run.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...model.gpt import Kept
from ...model.mlp import ACTIVATIONS, Context
from ...model.resmlp import BlockContext
from .. import resmlp_stack as resstack
from ..base import HeldBytes, NonFiniteWatch
from . import gpt_recompute


@dataclass
class Saved:
    """What the forward of one (micro-batch, chunk) kept, and the bytes it holds."""

    x: object  # the chunk's input
    zs: list | None  # selective: each layer's z (full: None); resmlp units: resstack.save_selective's
    held: int
    units: bool | str = False  # zs came from resstack.save_selective (True) or gpt_recompute's ("gpt")


def save(mode: str, x, contexts: list) -> Saved:
    """Keep the chunk input (full), or the input and the z's (selective), and drop the rest."""
    if mode == "full":
        return Saved(x, None, x.nbytes)
    if any(isinstance(ctx, Kept) for ctx in contexts):  # --arch gpt's units (gpt_recompute.py)
        return Saved(x, *gpt_recompute.save_selective(contexts), units="gpt")
    if any(isinstance(ctx, BlockContext) for ctx in contexts):
        return Saved(x, *resstack.save_selective(x, contexts), units=True)
    zs = [ctx.z for ctx in contexts]
    counted = sum(ctx.z.nbytes for ctx in contexts if ctx.z is not ctx.y)  # logits: z IS the output
    return Saved(x, zs, x.nbytes + counted)


def restore(mode: str, saved: Saved, stack) -> list:
    """The Contexts again: full re-runs the forward (charging the clock and any tp traffic);
    selective applies each layer's activation to its kept z."""
    if mode == "full":
        return stack.forward(saved.x, HeldBytes(), NonFiniteWatch())[1]
    if saved.units == "gpt":
        return gpt_recompute.restore_selective(saved.zs, stack)
    if saved.units:
        return resstack.restore_selective(saved.x, saved.zs, stack)
    contexts, x = [], saved.x
    for layer, z in zip(stack.store.layers, saved.zs):
        y = ACTIVATIONS[layer.act][0](z)
        clock = layer.rt.clock  # the run's, handed to the layer by the strategy that built it
        if clock is not None and layer.act != "none":  # read z, write y
            clock.stream(2 * z.size * z.itemsize)
        contexts.append(Context(x, z, y))
        x = y
    return contexts


def context_bytes(contexts: list) -> int:
    return sum(ctx.nbytes for ctx in contexts)
