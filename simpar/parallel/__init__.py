"""Parallel strategies. Each file is one layout, readable alone:

  data.py      data parallelism (DDP): gradient buckets all-reduced while backward still runs
  zero.py      ZeRO-1/2/3: data parallelism with optimizer state / gradients / parameters sharded;
               zero_mesh.py ZeRO-1 inside tp/pp shards, zero_tp.py ZeRO-2/3 inside gpt's tp shards
  tensor.py    Megatron tensor parallelism: column- then row-parallel linear pairs (f and g)
  restensor.py the residual MLP's blocks under tensor parallelism, and sequence parallelism (--sp)
  tensor_gpt.py, vocab_parallel.py  the transformer (--arch gpt) under tp [--sp]: heads split by
               columns, the embedding, LM head and cross-entropy split over the vocabulary
  context.py   context parallelism (--cp, --arch gpt): the sequence split over ranks, ring or all-to-all
               attention (model/ring_attention.py); context_zero.py: with --zero, sharded over dp x cp;
               context_expert.py: with --experts, MoE blocks' experts over ep at each cp coordinate;
               context_expert_tensor.py: the same with --tp (expert_tensor_gpt.py's tp groups);
               context_expert_zero.py: with --zero
  expert.py    mixture of experts: experts sharded over --ep ranks, tokens moved by all-to-all;
               expert_gpt.py the same for the transformer's MoE blocks (--arch gpt --experts),
               expert_tensor_gpt.py with --tp (attention over tp, the MoE part replicated on it),
               pipeline/expert_stage.py with --pp (each stage's blocks over its ep group),
               pipeline/context_expert_stage.py with --pp and --cp,
               expert_zero.py with --zero 1-3 (dense states sharded over dp, the experts' over edp),
               expert_zero_tp.py the same with --tp
  pipeline.py  pipeline parallelism: stages, micro-batches, schedules (naive, GPipe, 1F1B, interleaved, ZB-H1,
               ZB-V); its messages in pipeline_comms.py, the schedules as data in schedules.py

`build_strategy` picks the one a RunConfig asks for; all share the interface in base.py.
"""

from __future__ import annotations

from ..config import StrategySections


def build_strategy(cfg, mesh):
    """The strategy `cfg` asks for. Each gets only the sections it reads (`sections`, config.StrategySections:
    model, layout, optimisation), never the whole RunConfig."""
    sections = StrategySections.of(cfg)
    if cfg.zero > 1 and cfg.tp > 1 and not cfg.experts:  # ZeRO-2/3 of each tp share, unit by unit (gpt)
        from .zero_tp import ZeroGptTensorLayerwise

        return ZeroGptTensorLayerwise(sections, mesh)
    if cfg.zero and cfg.tp > 1 and cfg.experts:  # tp shares' states over dp (x cp), experts' over edp (x cp)
        from .expert_zero_tp import ContextExpertZeroTensor, ExpertZeroTensor

        return (ContextExpertZeroTensor if cfg.cp > 1 else ExpertZeroTensor)(sections, mesh)
    if cfg.zero and (cfg.tp > 1 or cfg.pp > 1):  # ZeRO-1 of each model shard over its dp (x cp) group
        from . import zero_mesh

        return zero_mesh.strategy_class(cfg.pp > 1, cfg.cp > 1, cfg.tp > 1, cfg.arch == "gpt")(sections, mesh)
    if cfg.cp > 1 and cfg.pp > 1 and cfg.experts:
        from .pipeline.context_expert_stage import ContextExpertPipelineParallel  # MoE stages with cp (x tp)

        return ContextExpertPipelineParallel(sections, mesh)
    if cfg.cp > 1 and cfg.tp > 1 and cfg.pp > 1:
        from .pipeline.context_tensor_stage import ContextTensorPipelineParallel  # pp x dp x cp x tp

        return ContextTensorPipelineParallel(sections, mesh)
    if cfg.cp > 1 and cfg.tp > 1 and cfg.experts:
        from .context_expert_tensor import ContextExpertTensorParallel  # MoE blocks, cp x tp, ep in dp

        return ContextExpertTensorParallel(sections, mesh)
    if cfg.cp > 1 and cfg.tp > 1:
        from .context_tensor import ContextTensorParallel  # heads and vocabulary split inside a cp rank

        return ContextTensorParallel(sections, mesh)
    if cfg.cp > 1 and cfg.pp > 1:
        from .pipeline.context_stage import ContextPipelineParallel  # cp ranks inside each stage

        return ContextPipelineParallel(sections, mesh)
    if cfg.cp > 1 and cfg.experts and cfg.zero:
        from .context_expert_zero import ContextExpertZero  # ZeRO over dpcp (dense) and edpcp (experts)

        return ContextExpertZero(sections, mesh)
    if cfg.cp > 1 and cfg.experts:
        from .context_expert import ContextExpertParallel  # MoE blocks, experts over ep at each cp coordinate

        return ContextExpertParallel(sections, mesh)
    if cfg.cp > 1 and cfg.zero:
        from .context_zero import ContextZero  # ZeRO over the dp x cp group

        return ContextZero(sections, mesh)
    if cfg.cp > 1:
        from .context import ContextParallel

        return ContextParallel(sections, mesh)
    if cfg.experts and cfg.arch == "gpt" and cfg.pp > 1:
        from .pipeline.expert_stage import ExpertPipelineParallel  # MoE blocks on pipeline stages (and tp)

        return ExpertPipelineParallel(sections, mesh)
    if cfg.experts and cfg.arch == "gpt" and cfg.tp > 1:
        from .expert_tensor_gpt import ExpertTensorParallel  # attention over tp, experts replicated on it

        return ExpertTensorParallel(sections, mesh)
    if cfg.experts and cfg.arch == "gpt" and cfg.zero:
        from .expert_zero import ExpertZero  # ZeRO: dense states over dp, the experts' over edp

        return ExpertZero(sections, mesh)
    if cfg.experts and cfg.arch == "gpt":
        from .expert_gpt import GptExpertParallel  # MoE transformer blocks, ep inside dp

        return GptExpertParallel(sections, mesh)
    if cfg.experts:
        from .expert import ExpertParallel

        return ExpertParallel(sections, mesh)
    if cfg.zero:
        from .zero import ZeroDataParallel

        return ZeroDataParallel(sections, mesh)
    if cfg.pp > 1:
        from .pipeline.engine import PipelineParallel

        return PipelineParallel(sections, mesh)
    if cfg.tp > 1:
        from .tensor import TensorParallel

        if cfg.arch == "gpt":  # heads, vocabulary-parallel embedding, head and loss; --sp
            from .tensor_gpt import GptTensorParallel

            return GptTensorParallel(sections, mesh)
        if cfg.arch == "resmlp":  # residual blocks, and --sp
            from .tensor_resmlp import ResTensorStack

            return TensorParallel(sections, mesh, stack=ResTensorStack(sections.model, sections.layout, mesh))
        return TensorParallel(sections, mesh)
    from .data import DataParallel

    return DataParallel(sections, mesh)
