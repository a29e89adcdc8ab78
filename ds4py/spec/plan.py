"""What ``ds4py.generate`` drafts with: the policy, the drafter and the pairing verdict.

    plan = draft_plan(model, draft=None, draft_depth=None, force_draft=False)
    plan.policy, plan.drafter, plan.report, plan.reason

Defaults (issue 14): drafting is on when the model has a nextn head the
pairing classifier allows -- its bundled head (NOT_APPLICABLE: nothing to
pair), or a ``draft_head`` sidecar measured good (or unknown and forced) --
for greedy and sampled generation alike; the adaptive policy chooses the
depth. The default policies of one model share one CostModel: the round
costs it measures (plain step, verify per width, draft step) are the
model's on this machine, so a request does not start from the priors again
(it keeps its own acceptance estimates: those belong to the text).
A model loaded with a DFlash drafter (``ds4py.load(..., dflash=FILE)``,
``--dflash FILE``: ``model.dflash``) drafts with it instead of its head,
under the same classifier (its verdict for the (trunk, DFlash) pair) and
policy; each generation gets its own drafting context
(:class:`ds4py.dflash.DFlashDrafter`, whose TapSession the loop uses).
``draft=False`` (``--no-draft``) turns it off, ``draft_depth=K``
(``--draft-depth K``) fixes the depth (0 is off), ``force_draft``
(``--force-draft``) overrides REFUSE_UNKNOWN only, ``sampling``
(``--spec-sampling``) picks how sampled rounds decide: "exact" (default,
output identical to undrafted) or "rejection" (stochastic drafting,
ds4py.spec.runner).

A draft that the classifier refuses on structure raises PairingError (the
core refuses the same file at load anyway). A refused verdict just means no
drafting: the output is the same either way, only the speed differs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from .classifier import PairingReport, classify
from .drafter import Drafter, NextnDrafter
from .policy import AdaptivePolicy, CostModel, FixedPolicy, Policy

__all__ = ["DraftPlan", "draft_plan"]

_REPORTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_COSTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def model_costs(model) -> CostModel:
    """The CostModel the default adaptive policies of ``model`` share."""
    costs = _COSTS.get(model)
    if costs is None:
        costs = _COSTS[model] = CostModel()
    return costs


@dataclass
class DraftPlan:
    policy: Policy | None        # None: no drafting
    drafter: Drafter | None
    report: PairingReport | None
    reason: str | None           # why not drafting (None when drafting)
    sampling: str = "exact"      # sampled rounds: "exact" or "rejection" (ds4py.spec.runner)

    @property
    def active(self) -> bool:
        return self.policy is not None and self.drafter is not None


def pairing_report(model, force: bool = False, pairs_file: str | None = None):
    """The classifier's verdict for ``model``'s DFlash drafter when it has
    one, else for its head (cached per model and force flag), or None when
    the model has neither."""
    dfl = getattr(model, "dflash", None)
    if dfl is None and model.nextn_source is None:
        return None
    cache = _REPORTS.setdefault(model, {})
    # the pair's verdict on the backend this model runs on (classifier "Backends")
    backend = getattr(model, "backend", "") or "cpu"
    key = (bool(force), pairs_file, None if dfl is None else dfl.path)
    if key not in cache:
        if dfl is not None:
            cache[key] = classify(model.path, force=force, pairs_file=pairs_file,
                                  dflash=dfl.path, backend=backend)
        else:
            head = model.draft_head if model.nextn_source == "draft_head" else None
            cache[key] = classify(model.path, head, force=force, pairs_file=pairs_file,
                                  backend=backend)
    return cache[key]


def draft_plan(model, draft: bool | None = None, draft_depth: int | None = None,
               force_draft: bool = False, policy: Policy | None = None,
               drafter: Drafter | None = None, pairs_file: str | None = None,
               sampling: str | None = None) -> DraftPlan:
    plan = _draft_plan(model, draft, draft_depth, force_draft, policy, drafter, pairs_file)
    if sampling is not None:
        from .runner import SAMPLING_MODES

        if sampling not in SAMPLING_MODES:
            raise ValueError(f"spec_sampling must be one of {', '.join(SAMPLING_MODES)}, "
                             f"got {sampling!r}")
        plan.sampling = sampling
    return plan


def _draft_plan(model, draft, draft_depth, force_draft, policy, drafter,
                pairs_file) -> DraftPlan:
    if draft_depth is not None and (isinstance(draft_depth, bool) or
                                    not isinstance(draft_depth, int) or draft_depth < 0):
        raise ValueError(f"draft_depth must be an int >= 0, got {draft_depth!r}")
    if draft is False or draft_depth == 0:
        return DraftPlan(None, None, None, "drafting off")
    if policy is None:
        # Requests of a model share the measured costs (the model's and the
        # machine's) but not the acceptance estimates (the text's): each
        # starts from the prior. Sharing them (until 2026-11-30) made a
        # request relax toward the previous request's acceptance -- prose
        # after code kept drafting depth 3 at 0.88x serial (make bench-spec:
        # 0.90x) -- and replaying the demo traces in bench order through one
        # shared list averaged 1.068x (worst 0.987) against 1.129x (worst
        # 1.030) with fresh estimates (/tmp/s9/replay_seq.py, the
        # tests/test_policy.py cost table).
        policy = (FixedPolicy(draft_depth) if draft_depth is not None
                  else AdaptivePolicy(costs=model_costs(model)))
    if drafter is not None:  # a caller's own drafter: nothing to classify
        return DraftPlan(policy, drafter, None, None)
    report = pairing_report(model, force_draft, pairs_file)
    if report is None:
        return DraftPlan(None, None, None, "the model has no nextn head")
    if not report.allowed:
        return DraftPlan(None, None, report, f"pairing verdict {report.verdict}")
    dfl = getattr(model, "dflash", None)
    if dfl is not None:
        from ..dflash import DFlashDrafter  # ds4py.dflash imports this package

        return DraftPlan(policy, DFlashDrafter(dfl), report, None)
    return DraftPlan(policy, NextnDrafter(model), report, None)
