"""Speculative decoding inside the engine (chapter 10): drafts ride along a sequence's decode step.

A decoding sequence normally feeds one token per step. With a drafter, it feeds its last token and
up to k drafted ones; the one model call of the step returns the target's logits at all of them,
and the acceptance test (`reference.speculative.accept_drafts`) keeps a prefix of the drafts
plus one token from the target (the residual at the first rejection, or the bonus token). The
slots of rejected drafts are handed back (`BlockManager.truncate`); their K/V will be overwritten
by position, so no copy or clean-up of the pool is needed.
"""
from __future__ import annotations

import torch
from torch import Tensor

from reference.decoding import filtered_probs
from reference.drafters import PromptLookupDrafter, layer_skip_drafter
from reference.engine.sequence import Sequence
from reference.speculative import accept_drafts

METHODS = ("prompt_lookup", "layer_skip")


class Speculator:
    """Drafts for decoding sequences and the acceptance test on the target's logits.

    method: "prompt_lookup" (copy what followed the last n-gram's earlier occurrence: no model),
    "layer_skip" (the target's first `draft_layers` layers, its norm and head draft), or a
    callable returning a new drafter (see reference.drafters: reset(max_len), propose(...)).
    k: drafts per step at most.
    """

    def __init__(self, model, method: str, k: int, draft_layers: int | None = None):
        if not callable(method) and method not in METHODS:
            raise ValueError(f"speculative must be one of {METHODS}, a drafter factory or None, got {method!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"num_speculative_tokens must be an int >= 1, got {k!r}")
        self.model, self.method, self.k = model, method, k
        self.draft_layers = draft_layers or max(1, model.config.n_layers // 4)
        self.counters = {"rounds": 0, "proposed": 0, "checked": 0, "accepted": 0}

    def propose(self, seq: Sequence, room: int) -> None:
        """Set seq.draft_ids (and seq.draft_probs) to at most min(k, room) drafted tokens."""
        p = seq.params
        left = min(self.k, room, p.max_tokens - len(seq.output_ids) - 1,
                   self.model.config.max_seq_len - seq.num_tokens - 1)
        seq.draft_ids, seq.draft_probs = [], None
        if left <= 0:
            return
        if seq.drafter is None:
            seq.drafter = (self.method() if callable(self.method)
                           else PromptLookupDrafter() if self.method == "prompt_lookup"
                           else layer_skip_drafter(self.model, self.draft_layers))
            seq.drafter.reset(min(seq.num_prompt_tokens + p.max_tokens, self.model.config.max_seq_len))
        with torch.inference_mode():
            ids, probs = seq.drafter.propose(seq.token_ids, left, lambda x: self.probs(seq, x), seq.generator)
        seq.draft_ids, seq.draft_probs = list(ids), probs

    @staticmethod
    def probs(seq: Sequence, logits: Tensor) -> Tensor:
        """The request's sampling distribution(s) from logits [..., vocab], on the CPU (where the
        request's generator draws)."""
        return filtered_probs(logits.cpu(), *seq.params.filters)

    def verify(self, seq: Sequence, logits: Tensor) -> list[int]:
        """Tokens to emit, given the target's logits [1 + len(drafts), vocab] at the last token and
        at each draft: the accepted drafts, then the residual sample or the bonus token."""
        drafts = seq.draft_ids
        emitted, checked, accepted = accept_drafts(self.probs(seq, logits), drafts, seq.draft_probs, seq.generator)
        self.counters["checked"] += checked
        self.counters["accepted"] += accepted
        self.counters["rounds"] += 1
        self.counters["proposed"] += len(drafts)
        seq.draft_ids, seq.draft_probs = [], None
        return emitted
