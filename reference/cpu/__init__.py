"""The fast CPU path, kept apart from the model a learner reads (reference/model.py).

`CpuModel(model)` runs a plain float32 `reference.model.Llama` on the CPU with the model's own
calls (`cpu_model(input_ids, positions, cache, context=..., num_layers=..., logits_rows=...,
mask=...)`, `new_cache`, `config`) and the same logits up to float rounding:

- a pass over 1 to 16 new positions of one sequence over a `KVCache` (a decode step, a
  verification of k drafts, a short prompt or a prompt's chunk; causal, all logit rows or some):
  one native call (`native_step`, reference/cpu/native_step.c) on a copy of the weights packed in
  the order the C code streams them, each weight read once for all the positions;
- an engine step (a `PagedContext` with the "torch" backend): the products through weights
  packed once for oneDNN (`cpu_linear`), the element-wise work between them and the decode rows'
  attention in C (`native_batch`, `native_attention`);
- any other pass (a longer prefill, a batch, a self-draft over the first layers, a custom mask
  such as a draft tree's): the model's arithmetic, written out below, with its products through
  `cpu_linear.linear`.

What it cannot serve it refuses when it is built (`ValueError`), not step by step: a model that
is not a float32 `Llama` on the CPU, one whose blocks hold modules of other kinds, or one with a
hook on any of its modules (the native pass would skip the hook). It serves the modules it was
built on: replace a module, build another (`backend_for` does; a weight replaced or changed in
place is seen and packed again). `backend_for(model, backend)`
is how `generate`, `LLM`, the command line and the server choose: "auto" (the default) a
`CpuModel` where one can be built, else the plain model; "cpu" a `CpuModel` or the reason it
cannot be; "torch" the plain model. tests/model/test_cpu_backend.py holds the three (backend,
plain model, float64) together on the real model and a tiny one.
"""
from __future__ import annotations

import itertools
import operator
import weakref

import torch
from torch import Tensor
from torch.nn import functional as F
from torch.nn.modules import module as module_hooks

from reference.context import DenseContext, PagedContext
from reference.cpu import cpu_linear, native_batch, native_step
from reference.kv_cache import KVCache
from reference.model import Llama, rotate_complex_

BACKENDS = ("auto", "cpu", "torch")
_built: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> its CpuModel


def why_not(model) -> str | None:
    """Why no `CpuModel` can be built on `model` (None: one can)."""
    if type(model) is not Llama:
        return f"a CpuModel runs a reference.model.Llama, not a {type(model).__name__}"
    weight = model.embed.weight
    if not weight.is_cpu or weight.dtype != torch.float32:
        return f"a CpuModel runs float32 weights on the CPU; this model's are {weight.dtype} on {weight.device}"
    try:
        own = native_step._own_kinds(model, native_step._weight_modules(model))
    except AttributeError:
        own = False
    if not own:
        return ("the model's blocks are not all of the kinds reference.model builds (a module was "
                "replaced): a CpuModel does their arithmetic, not a replacement's")
    hooked = [name or "the model" for name, module in model.named_modules()
              if module._forward_hooks or module._forward_pre_hooks]
    if module_hooks._global_forward_hooks or module_hooks._global_forward_pre_hooks:
        hooked.append("every module (a global forward hook)")
    if hooked:
        return (f"a hook is registered on {hooked[0]}: the native pass would not run it "
                "(use backend='torch' to watch the model's operators)")
    return None


class CpuModel:
    """`model` run fast on the CPU (see the module's docstring). Attributes the model has and
    this object does not (config, new_cache, device, blocks, ...) are the model's."""

    def __init__(self, model: Llama):
        problem = why_not(model)
        if problem:
            raise ValueError(problem)
        self.model = model
        self.modules = native_step._weight_modules(model)   # the modules it serves
        native_step.forget(model)       # packed from these modules, now, not at the first step
        if native_step.runs(model):
            native_step._table(model)

    def serves_modules(self) -> bool:
        """Whether the model still holds the modules this CpuModel was built on."""
        try:
            return all(map(operator.is_, native_step._weight_modules(self.model), self.modules))
        except AttributeError:
            return False

    def __getattr__(self, name: str):
        if name == "model":      # not set yet (a copy being made): no model to ask
            raise AttributeError(name)
        return getattr(self.model, name)

    @torch.inference_mode()
    def __call__(self, input_ids: Tensor, positions: Tensor | None = None, cache: KVCache | None = None,
                 *, context: PagedContext | None = None, num_layers: int | None = None,
                 logits_rows: Tensor | None = None, mask: Tensor | None = None) -> Tensor:
        """`Llama.forward`'s arguments and result (logits [B, T or R, vocab], float32)."""
        model = self.model
        if native_step.serves(model, input_ids, positions, cache, context, num_layers, logits_rows, mask):
            logits = native_step.forward(model, input_ids, cache, positions, logits_rows)
            if logits is not None:
                return logits
        if context is not None and native_batch.serves(model, context, num_layers):
            return native_batch.paged_step(model, input_ids, context, logits_rows)
        if context is not None and context.backend != "torch":
            return model(input_ids, context=context, num_layers=num_layers, logits_rows=logits_rows)
        return self._operators(input_ids, positions, cache, context, num_layers, logits_rows, mask)

    def _operators(self, input_ids, positions, cache, context, num_layers, logits_rows, mask) -> Tensor:
        """`Llama.forward`, its products through packed weights (`cpu_linear.linear`)."""
        model, cfg, linear = self.model, self.model.config, cpu_linear.linear
        if context is None:
            context = DenseContext.for_step(cache, input_ids.shape[1], positions, input_ids.device,
                                            model.attention_backend, mask)
        turns = torch.view_as_complex(model.rope_turns[context.rope_rows].float())
        x = model.embed(input_ids)
        for layer, block in enumerate(itertools.islice(model.blocks, num_layers)):
            heads = linear(_rms_norm(x, block.attn_norm), block.attn.qkv_proj.weight)
            heads = heads.unflatten(-1, (-1, cfg.head_dim))
            rotate_complex_(heads[:, :, :cfg.n_heads + cfg.n_kv_heads], turns)
            q, k, v = heads.split((cfg.n_heads, cfg.n_kv_heads, cfg.n_kv_heads), dim=2)
            x = x + linear(context.attend(layer, q, k, v), block.attn.o_proj.weight)
            gate, up = linear(_rms_norm(x, block.mlp_norm), block.mlp.gate_up_proj.weight).chunk(2, dim=-1)
            x = x + linear(F.silu(gate) * up, block.mlp.down_proj.weight)
        if logits_rows is not None:
            x = x[:, logits_rows]
        return linear(_rms_norm(x, model.norm), model.embed.weight).float()


def _rms_norm(x: Tensor, norm) -> Tensor:
    """`RMSNorm` as its formula: in float32 on a CPU the same bits as `F.rms_norm` in six small
    operators, where the composite runs eight."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm.eps) * norm.weight


def backend_for(model, backend: str = "auto"):
    """`model` as `backend` runs it: "torch" the plain model; "cpu" its `CpuModel` (ValueError
    saying why where none can be built); "auto" its `CpuModel` where one can be built, else the
    plain model. A model's `CpuModel` is built once and kept while the model lives."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "torch" or isinstance(model, CpuModel):
        return model.model if backend == "torch" and isinstance(model, CpuModel) else model
    problem = why_not(model)
    if problem:
        if backend == "cpu":
            raise ValueError(problem)
        return model
    if model not in _built or not _built[model].serves_modules():
        _built[model] = CpuModel(model)
    return _built[model]
