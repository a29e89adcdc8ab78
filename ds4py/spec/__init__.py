"""Speculative decoding: drafters, the draft-depth policy, the greedy loop.

All policy lives here, in Python; the core provides the batched verify
(``Session.verify``), exact rollback (``Session.accept``), the nextn head's
steps (``Model.nextn_eval`` / ``nextn_draft``) and the target's hidden rows.

    from ds4py.spec import speculative_generate
    tokens, stats = speculative_generate(model, prompt_ids, max_tokens=128,
                                         eos_ids=model.tokenizer.eog_ids)

- :mod:`ds4py.spec.loop`: ``speculative_generate`` (greedy, byte-identical
  to serial greedy decoding).
- :mod:`ds4py.spec.runner`: ``SpecRunner``, one run's rounds (shared by
  ``speculative_generate`` and ``ds4py.generate``); depth-0 rounds are the
  serial step (:mod:`ds4py.spec.stepper`), greedy head rounds are two core
  calls (csrc/spec_round.c).
- :mod:`ds4py.spec.drafter`: the ``Drafter`` interface and ``NextnDrafter``
  (the model's bundled or draft_head nextn/MTP head, its history kept by the
  core's head priming).
- :mod:`ds4py.spec.plan`: what ``ds4py.generate`` (and the server's engine)
  drafts with (policy, drafter -- the nextn head, or the DFlash drafter of
  a model loaded with ``dflash=`` (ds4py.dflash) --, pairing verdict; one
  shared CostModel per model).
- :mod:`ds4py.spec.rejection`: standard speculative (rejection) sampling,
  used by the runner's ``sampling="rejection"`` (``--spec-sampling``).
- :mod:`ds4py.spec.policy`: ``AdaptivePolicy`` (per-depth acceptance EMA,
  verify cost fitted online, probes against the depth-0 latch),
  ``FixedPolicy`` (``--draft-depth K``; ``FixedPolicy(0)`` / ``NO_DRAFT``
  is ``--no-draft``).
"""

from .drafter import Drafter, DraftError, DraftState, NextnDrafter
from .loop import speculative_generate
from .policy import NO_DRAFT, AdaptivePolicy, CostModel, FixedPolicy, Policy

__all__ = ["speculative_generate", "Drafter", "DraftState", "DraftError", "NextnDrafter",
           "Policy", "AdaptivePolicy", "FixedPolicy", "NO_DRAFT", "CostModel"]
