"""Does a drafter + verifier sample exactly as the target? The statistics behind ``python -m specdec.verify_dist``.

Method
------
1. **Sample.** Each of the M prompts is continued N times (``samples_per_prompt``) by L tokens
   (``data.max_new_tokens``) with speculative decoding, in batches of ``data.batch_size`` rows that mix
   prompts (so left padding is exercised). EOS does not stop a row: every continuation has exactly L
   tokens, and the target's conditional after an EOS is as well defined as before it.
2. **Score against the exact conditionals.** The target runs once over prompt + continuation (teacher
   forcing, a fresh cache, one forward per batch), and its logits go through the same
   :func:`~specdec.verify.sampling.logits_to_probs` as in decoding: row t is the exact law of token t given what
   was emitted before it. Each token is reduced on the fly to what the tests need
   (:func:`specdec.exactness.stats.token_scores`: four numbers, not V), so [N·M, L, V] is never held.
3. **Test.** :func:`specdec.exactness.stats.exactness_test_from_scores`: randomised PIT + Kolmogorov–Smirnov, and the
   surprisal z-test, pooled over all tokens and per position t = 0..L−1; the same PIT values on
   ``PIT_BINS`` equal cells (chi-square), which the detectable-bias figure is computed for; and a
   two-sample chi-square test of the joint of the first ``joint_tokens`` tokens (with the prompt) between
   speculative and plain (:func:`~specdec.decode.engine.autoregressive_generate`) sampling, stratified by prompt,
   small cells pooled. The same PIT and surprisal tests per *stratum* of tokens by what the drafter did
   before the token was drawn (drafted, per draft depth, undrafted, bonus), and at drafted positions the
   directional draft-match test and, for sampled tree candidates, the sibling-match test
   (:mod:`specdec.exactness.strata`: a verifier bug acts only where drafts were verified).
   Holm's step-down over the whole family keeps the probability of rejecting an exact decoder ≤ the
   significance level (``significance``), however the tests depend on each other.
4. **Report.** The verdict, every p-value (raw and Holm-adjusted), total-variation intervals of the PIT
   law per position, and the *detectable bias*: the smallest TV shift the run detects with power 0.8
   (:func:`specdec.exactness.stats.detectable_tv`, worst-case alternative, at the level one test of the family is
   held to), per position, pooled and per stratum; and a budget: the continuations this drafter needs to
   detect a given bias at drafted positions with power 0.9 (``detect_tv`` plans N that way from a pilot).
   A pass means "no bias of at least that size", never "no bias at all"; a run too small to detect even
   the largest bias there is (pooled detectable TV >= 1) says ``inconclusive`` instead of passing.

Why the TV figures are about the PIT: the randomised PIT maps token x to a uniform draw on its own
interval of width p(x), so for one conditional p it preserves total variation exactly: a token law q with
TV(q, p) = δ gives a PIT law at TV δ from Uniform(0, 1). Binned into ``PIT_BINS`` cells and pooled over
rows, it can only shrink; so a lower TV bound on the PIT law is a lower bound on the token-level bias, and
a bias of TV ≥ δ that moves the same part of the PIT range in every row (toward likely tokens, or the
tail — what temperature, truncation and residual mistakes do) is detected with the stated power.

Planted bugs (:mod:`specdec.exactness.planted`, ``planted_bug=<name>``, never by default) make a run deliberately
wrong; the run says so in its output and in ``verify.json``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import numpy as np
import torch
from scipy import stats as sps
from tqdm import tqdm

from specdec.decode.engine import GenerationOutput, autoregressive_generate, speculative_generate
from specdec.decode.metrics import DecodeStats
from specdec.drafters import Drafter
from specdec.exactness import planted, strata
from specdec.exactness.shared_prefill import fast_decoder
from specdec.exactness.stats import (
    TokenScores, Verdict, chi2_two_sample, detectable_tv, exactness_test_from_scores, holm, pit_from_scores,
    token_scores, tv_to_distribution, tv_two_sample, uniformity_chi2)
from specdec.exactness.strata import DraftRecord, DraftRecorder
from specdec.jobs.data import left_pad
from specdec.models.backend import Backend
from specdec.verify import EXACT
from specdec.verify.sampling import SamplingParams, logits_to_probs

log = logging.getLogger(__name__)

EXIT_REJECTED = 3
EXIT_INCONCLUSIVE = 4  # no rejection, but the run could not have detected any bias (pooled detectable TV >= 1)
PIT_BINS = 10  # cells of the PIT law for TV intervals and the detectable-bias figure
POWER = 0.8
_STREAMS = {"speculative": 0, "plain": 1, "pit": 2, "pilot": 3}  # independent random streams per seed
_PILOT_CONTINUATIONS = 64  # sampled (then discarded) to measure the drafter's proposal rate for detect_tv
_SCORE_ROWS = 256  # probabilities handed to token_scores at a time (bounds the float64 copy)


# --- sampling and scoring ----------------------------------------------------------------------------------


def _seed(seed: int, stream: str, batch: int = 0) -> int:
    """Independent random streams: speculative and plain sampling per batch, and the PIT's uniforms."""
    return int(np.random.SeedSequence([seed, _STREAMS[stream], batch]).generate_state(1)[0])


def _sampling_kwargs(params: SamplingParams) -> dict[str, Any]:
    return dict(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)


@dataclass
class Continuations:
    prompt_index: np.ndarray  # [R] which prompt each row continues
    tokens: np.ndarray  # [R, L] int64
    stats: DecodeStats  # merged over batches
    wall_time_s: float
    record: DraftRecord | None = None  # what the drafter did before each token (speculative sampling)


def sample_continuations(generate: Callable[..., GenerationOutput], prompts: Sequence[Sequence[int]],
                         prompt_index: np.ndarray, *, length: int, batch_size: int, seed: int, stream: str,
                         pad_id: int, device: torch.device, recorder: DraftRecorder | None = None,
                         desc: str = "sampling") -> Continuations:
    """Continue ``prompts[prompt_index[r]]`` by ``length`` tokens for every row r, ``batch_size`` rows at a
    time, with ``generate(ids, mask, generator)`` (EOS disabled, so every row gets ``length`` tokens); with
    ``recorder`` (the drafter ``generate`` runs), what the drafter did before each token too. ``desc`` names
    the phase on the progress bar."""
    start_time = time.perf_counter()
    out, stats, records = [], None, []
    batches = range(0, len(prompt_index), batch_size)
    for b, start in enumerate(tqdm(batches, desc=desc, unit="batch")):
        ids, mask = left_pad([list(prompts[i]) for i in prompt_index[start:start + batch_size]], pad_id, device)
        generator = torch.Generator(device=device).manual_seed(_seed(seed, stream, b))
        gen = generate(ids, mask, generator)
        if any(len(row) != length for row in gen.sequences):
            raise RuntimeError(f"a row ended before {length} tokens although EOS was disabled")
        out.append(np.asarray(gen.sequences, dtype=np.int64))
        stats = gen.stats if stats is None else stats.merge(gen.stats)
        if recorder is not None:
            records.append(recorder.take(length))
    return Continuations(prompt_index, np.concatenate(out), stats, time.perf_counter() - start_time,
                         DraftRecord.concat(records) if records else None)


@torch.no_grad()
def score_continuations(scorer: torch.nn.Module, prompts: Sequence[Sequence[int]], cont: Continuations,
                        params: SamplingParams, *, batch_size: int, pad_id: int,
                        desc: str = "scoring") -> tuple[TokenScores, np.ndarray]:  # scores, [R·L, W] p at the drafts
    """Every emitted token against the target's exact conditional (teacher forcing on a fresh cache, the
    logits processed like in decoding), and that conditional's probability of each draft token recorded at
    the position (``cont.record.candidates``; W = 0 without a record). ``scorer``: the correct target's
    decoder. Rows in [R, L] order."""
    device, length = scorer.device, cont.tokens.shape[1]
    candidates = np.zeros((*cont.tokens.shape, 0), np.int64) if cont.record is None else cont.record.candidates
    parts, at_drafts = [], []
    for start in tqdm(range(0, len(cont.prompt_index), batch_size), desc=desc, unit="batch"):
        ids, mask = left_pad([list(prompts[i]) for i in cont.prompt_index[start:start + batch_size]], pad_id, device)
        tokens = torch.from_numpy(cont.tokens[start:start + batch_size]).to(device)  # [B, L]
        batch, width = ids.shape
        cache = scorer.new_cache(batch, width + length, (mask == 0).sum(1))
        logits, _ = scorer(ids, cache, kv_len=width)  # the prompt's last position: the law of token 0
        logits = logits[:, -1:]  # [B, 1, V]
        if length > 1:  # teacher forcing: tokens 0..L-2 give the laws of tokens 1..L-1
            cache.commit(torch.full((batch,), width, device=device))
            rest, _ = scorer(tokens[:, :-1], cache, kv_len=width + length - 1)  # [B, L-1, V]
            logits = torch.cat([logits, rest], 1)
        probs = logits_to_probs(logits, params.temperature, params.top_k, params.top_p)  # [B, L, V]
        drafts = torch.from_numpy(candidates[start:start + batch_size]).to(device)  # [B, L, W]
        at_drafts.append(probs.gather(-1, drafts.clamp(min=0)).masked_fill(drafts < 0, 0.0).double().cpu().numpy())
        probs, tokens = probs.reshape(-1, probs.shape[-1]), tokens.reshape(-1)
        parts += [token_scores(probs[r:r + _SCORE_ROWS], tokens[r:r + _SCORE_ROWS])
                  for r in range(0, len(tokens), _SCORE_ROWS)]
    return TokenScores.concat(parts), np.concatenate(at_drafts).reshape(cont.tokens.size, candidates.shape[2])


# --- the tests --------------------------------------------------------------------------------------------


def first_tokens_two_sample(spec: Continuations, plain: Continuations, joint_tokens: int,
                            alpha: float) -> tuple[Verdict, tuple[float, float, float]]:
    """Chi-square homogeneity of the first ``joint_tokens`` tokens between the two samples, stratified by
    prompt (a sum of per-prompt statistics and their dof: the design fixes how many rows each prompt
    has), small cells pooled within a prompt; and a 95% TV interval over outcomes seen ≥ 10 times (the
    rest pooled per prompt; the lower end bounds the full TV, the upper end the coarsened one)."""
    stat, dof = 0.0, 0
    for prompt in np.unique(spec.prompt_index):
        a = spec.tokens[spec.prompt_index == prompt, :joint_tokens]
        b = plain.tokens[plain.prompt_index == prompt, :joint_tokens]
        v = chi2_two_sample(a, b, alpha=alpha)
        stat, dof = stat + v.statistic, dof + int(v.dof)
    p = float(sps.chi2.sf(stat, dof)) if dof > 0 else 1.0
    name = f"chi2_two_sample[first {joint_tokens} tokens]"
    verdict = Verdict.from_p(name, stat, p, alpha, dof=dof, n=len(spec.prompt_index) + len(plain.prompt_index))

    def outcomes(c: Continuations) -> list[tuple[int, ...]]:
        return [(int(i), *map(int, row)) for i, row in zip(c.prompt_index, c.tokens[:, :joint_tokens])]

    a, b = outcomes(spec), outcomes(plain)
    counts: dict[tuple[int, ...], int] = {}
    for o in a + b:
        counts[o] = counts.get(o, 0) + 1
    coarse = lambda o: o if counts[o] >= 10 else (o[0], "other")  # noqa: E731
    a, b = [coarse(o) for o in a], [coarse(o) for o in b]
    tv = tv_two_sample(a, b, confidence=0.95, num_categories=len(set(a) | set(b)))
    return verdict, tv


def _pit_bins(u: np.ndarray) -> np.ndarray:  # [n] in [0, 1] -> [n] in [0, PIT_BINS)
    return np.minimum((u * PIT_BINS).astype(np.int64), PIT_BINS - 1)


@dataclass
class VerifyResult:
    reject: bool
    report: dict[str, Any]  # verify.json
    pit: np.ndarray  # [R, L] randomised PIT values, Uniform(0, 1) under exactness (for plots)


def check_settings(*, length: int, samples_per_prompt: int, batch_size: int, joint_tokens: int, significance: float,
                   temperature: float, detect_tv: float | None = None, planted_bug: str | None = None,
                   min_rows_per_position: int = 100, max_samples_per_prompt: int = 4096) -> None:
    """Refuse settings :func:`verify_distribution` cannot run with (no model needed: ``python -m specdec.verify_dist``
    calls it before the target loads)."""
    for name, value, low in (("length", length, 1), ("samples_per_prompt", samples_per_prompt, 1),
                             ("batch_size", batch_size, 1), ("joint_tokens", joint_tokens, 0),
                             ("min_rows_per_position", min_rows_per_position, 1),
                             ("max_samples_per_prompt", max_samples_per_prompt, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    if joint_tokens > length:
        raise ValueError(f"joint_tokens ({joint_tokens}) cannot exceed the continuation length ({length})")
    if not 0.0 < significance < 1.0:
        raise ValueError(f"significance (the family-wise level) must lie in (0, 1), got {significance!r}")
    if temperature == 0:
        raise ValueError("verify_dist tests a sampling distribution, so it needs sampling.temperature > 0 (got 0, "
                         "greedy); under greedy decoding exactness is token identity with plain decoding, which "
                         "`python -m specdec.run` checks on every prompt ('greedy outputs identical to plain decoding')")
    if detect_tv is not None and not 0.0 < detect_tv <= 1.0:
        raise ValueError(f"detect_tv (a TV distance) must lie in (0, 1], or be null to use samples_per_prompt; "
                         f"got {detect_tv!r}")
    if planted_bug is not None and planted_bug not in planted.BUGS:
        raise ValueError(f"unknown planted bug {planted_bug!r}; choose one of {sorted(planted.BUGS)} (or null for none)")


def verify_distribution(
    target: torch.nn.Module,  # a transformers causal LM (Llama family for batch > 1)
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],  # M prompts, token ids
    *,
    k: int,
    length: int,  # L tokens per continuation
    samples_per_prompt: int,  # N
    sampling: SamplingParams,
    batch_size: int = 64, seed: int = 0, significance: float = 0.01, joint_tokens: int = 2,
    min_rows_per_position: int = 100, planted_bug: str | None = None, pad_id: int = 0,
    detect_tv: float | None = None, max_samples_per_prompt: int = 4096, backend: Backend | None = None,
) -> VerifyResult:
    """Sample N·M continuations speculatively, test them against the exact target (see module docstring), its
    forwards on ``backend`` (None: ``Backend()``; a job passes its drafter's). With ``detect_tv``, N is planned
    instead (:func:`specdec.exactness.strata.plan_samples_per_prompt`) and ``samples_per_prompt`` is not used."""
    if not prompts:
        raise ValueError("verify_distribution needs at least one prompt")
    check_settings(length=length, samples_per_prompt=samples_per_prompt, batch_size=batch_size,
                   joint_tokens=joint_tokens, significance=significance, temperature=sampling.temperature,
                   detect_tv=detect_tv, planted_bug=planted_bug, min_rows_per_position=min_rows_per_position,
                   max_samples_per_prompt=max_samples_per_prompt)
    started = time.perf_counter()
    decoder = fast_decoder(target, backend)
    speculative, plain, recorder = _samplers(target, decoder, drafter, sampling, planted_bug, k=k, length=length,
                                             joint_tokens=joint_tokens)
    common = dict(batch_size=batch_size, seed=seed, pad_id=pad_id, device=decoder.device)
    plan = None
    if detect_tv is not None:
        samples_per_prompt, plan = _planned(speculative, recorder, prompts, detect_tv, significance=significance,
                                            max_samples_per_prompt=max_samples_per_prompt, length=length, **common)
    prompt_index = np.tile(np.arange(len(prompts)), samples_per_prompt)  # batches mix prompts
    spec = sample_continuations(speculative, prompts, prompt_index, length=length, stream="speculative",
                                recorder=recorder, desc="speculative sampling", **common)
    ref = sample_continuations(plain, prompts, prompt_index, length=joint_tokens, stream="plain",
                               desc="plain sampling", **common) if joint_tokens else None
    t0 = time.perf_counter()
    scores, p_drafts = score_continuations(decoder, prompts, spec, sampling, batch_size=batch_size, pad_id=pad_id)
    scoring_s = time.perf_counter() - t0
    reject, report, pit = judge(scores, spec, ref, significance=significance, seed=seed,
                                min_rows_per_position=min_rows_per_position, p_drafts=p_drafts)
    blind = not reject and report["detectable_tv"]["pooled"] >= 1.0  # TV is at most 1: no bias was detectable
    report = {
        "status": "ok",
        "verdict": "reject" if reject else "inconclusive" if blind else "pass",
        "exit_code": EXIT_REJECTED if reject else EXIT_INCONCLUSIVE if blind else 0,
        "planted_bug": planted_bug,
        **({"WARNING": _banner(planted_bug)} if planted_bug else {}),
        "lossy_drafter": drafter.traits.lossy,
        "significance": significance,
        **report,
        "num_prompts": len(prompts),
        "samples_per_prompt": samples_per_prompt,
        "plan": plan,
        "acceptance_rate": spec.stats.acceptance_rate,
        "mean_accepted_length": spec.stats.mean_accepted_length,
        "timings_s": {"speculative_sampling": spec.wall_time_s, "plain_sampling": ref.wall_time_s if ref else 0.0,
                      "scoring": scoring_s, "total": time.perf_counter() - started},
    }
    return VerifyResult(reject, report, pit)


def _samplers(target: torch.nn.Module, decoder: torch.nn.Module, drafter: Drafter, sampling: SamplingParams,
              planted_bug: str | None, *, k: int, length: int, joint_tokens: int
              ) -> tuple[Callable[..., GenerationOutput], Callable[..., GenerationOutput], DraftRecorder]:
    """The two samplers the test compares, each ``generate(ids, mask, generator)``: speculative sampling of ``length``
    tokens (through ``planted_bug``'s setup where one is given, else ``decoder``, the shared-prefill forward), the
    drafter watched by the recorder returned third; plain sampling of the first ``joint_tokens`` through ``decoder``."""
    setup = planted.plant(planted_bug, planted.Setup(target, drafter, None, sampling))
    if setup.target is target:  # not replaced by a planted bug: decode with the shared-prefill forward
        setup = replace(setup, target=decoder)
    if planted_bug is not None:
        log.warning(_banner(planted_bug))
    recorder = DraftRecorder(setup.drafter)
    # The rule verified with (the drafter's own lossy one stays unwatched: resolved by the decode loop).
    rule = None if setup.rule is None and setup.drafter.traits.acceptance is not None else recorder.watch(setup.rule or EXACT)

    def speculative(ids, mask, generator):
        return speculative_generate(setup.target, recorder, ids, attention_mask=mask, k=k,
                                    max_new_tokens=length, generator=generator, eos_token_id=[],
                                    rule=rule, **_sampling_kwargs(setup.sampling))

    def plain(ids, mask, generator):
        return autoregressive_generate(decoder, ids, attention_mask=mask, max_new_tokens=joint_tokens,
                                       generator=generator, eos_token_id=[], **_sampling_kwargs(sampling))

    return speculative, plain, recorder


def _planned(speculative: Callable[..., GenerationOutput], recorder: DraftRecorder, prompts: Sequence[Sequence[int]],
             detect_tv: float, *, significance: float, max_samples_per_prompt: int, length: int,
             **common: Any) -> tuple[int, Any]:
    """``detect_tv``'s samples per prompt and its plan (:func:`specdec.exactness.strata.plan_samples_per_prompt`),
    from a pilot of speculative sampling (``common``: :func:`sample_continuations`' batch settings)."""
    pilot_index = np.tile(np.arange(len(prompts)), math.ceil(_PILOT_CONTINUATIONS / len(prompts)))
    pilot = sample_continuations(speculative, prompts, pilot_index, length=length, stream="pilot",
                                 recorder=recorder, desc="pilot (planning detect_tv)", **common)
    samples_per_prompt, plan = strata.plan_samples_per_prompt(
        pilot.record, pilot.wall_time_s, detect_tv, num_prompts=len(prompts), alpha=significance, bins=PIT_BINS,
        max_samples_per_prompt=max_samples_per_prompt)
    log.info("detect_tv %s: %s", detect_tv, plan)
    return samples_per_prompt, plan


def judge(scores: TokenScores, spec: Continuations, ref: Continuations | None, *, significance: float, seed: int,
          min_rows_per_position: int,
          p_drafts: np.ndarray) -> tuple[bool, dict[str, Any], np.ndarray]:  # reject, report, PIT [R, L]
    """The family of tests on scored continuations (and the plain sample, if any), Holm at ``significance``;
    with ``spec.record``, the stratified tests too (:mod:`specdec.exactness.strata`; ``p_drafts`` [R·L, W]: the target's
    probability of each recorded draft token)."""
    rows, length = spec.tokens.shape
    alpha = significance  # the level each test is built at; Holm corrects it over the family
    family, pit, (two_sample, tv_joint) = _test_family(scores, spec, ref, alpha=alpha, seed=seed,
                                                       min_rows_per_position=min_rows_per_position, p_drafts=p_drafts)
    groups = [] if spec.record is None else strata.strata(spec.record, min_rows_per_position)
    adjusted, rejected = holm([v.p_value for v in family], alpha)
    tests = {v.name: {"name": v.name, "statistic": v.to_dict()["statistic"], "p_value": v.p_value,
                      "p_holm": float(a), "reject": bool(r), "n": v.n, "dof": v.dof}
             for v, a, r in zip(family, adjusted, rejected)}

    def pit_group(label: str, u: np.ndarray) -> dict[str, Any]:
        est, lo, hi = tv_to_distribution(_pit_bins(u), np.full(PIT_BINS, 1.0 / PIT_BINS), confidence=0.95)
        return {**{name: tests.get(f"{name}[{label}]") for name in ("pit_ks", "pit_chi2", "surprisal")},
                "tv_pit": {"estimate": est, "lower": lo, "upper": hi}}

    level = alpha / len(family)

    def stratum(label: str, mask: np.ndarray) -> dict[str, Any]:
        n = int(mask.sum())
        match = strata.match_summary(spec.record, p_drafts, spec.tokens, mask, level=level, power=POWER)
        siblings = strata.sibling_summary(spec.record, mask, level=level, power=POWER)
        return {"stratum": label, "n": n, "share": n / (rows * length), **pit_group(f"stratum={label}", pit.ravel()[mask]),
                "detectable_tv": detectable_tv(n, level, POWER, num_categories=PIT_BINS),
                "draft_match": None if match is None else {**match, "test": tests.get(f"draft_match[stratum={label}]")},
                "sibling_match": None if siblings is None else {
                    **siblings, "test": tests.get(f"sibling_match[stratum={label}]")}}

    report = {
        "p_value": float(adjusted.min()),  # Holm-adjusted minimum: the family's p-value
        "min_raw_p_value": float(min(v.p_value for v in family)),
        "num_tests": len(family),
        "length": length,
        "num_continuations": rows,
        "num_tokens": rows * length,
        "impossible_tokens": int((scores.p_token == 0).sum()),  # p(x) = 0 under the target: never exact
        "tests": list(tests.values()),
        "pooled": pit_group("pooled", pit.ravel()),
        "per_position": [{"position": t, "n": rows, **pit_group(f"position={t}", pit[:, t])} for t in range(length)],
        "two_sample": None if two_sample is None else {
            **tests.get(two_sample.name, {"name": two_sample.name, "p_value": two_sample.p_value, "dof": 0}),
            "outcome": f"prompt + first {ref.tokens.shape[1]} tokens",
            "tv": {"estimate": tv_joint[0], "lower": tv_joint[1], "upper": tv_joint[2]},
        },
        "detectable_tv": _detectable(rows, length, level, two_sample, len(ref.tokens) if ref else 0),
        "drafted_share": None if spec.record is None else float((spec.record.depth > 0).mean()),
        "strata": [stratum(label, mask) for label, mask in groups],
        "budget": None if spec.record is None else strata.budget(spec.record, p_drafts, level=level, bins=PIT_BINS),
    }
    return bool(rejected.any()), report, pit


def _test_family(scores: TokenScores, spec: Continuations, ref: Continuations | None, *, alpha: float, seed: int,
                 min_rows_per_position: int, p_drafts: np.ndarray) -> tuple[list[Verdict], np.ndarray, tuple]:
    """:func:`judge`'s tests, each at level ``alpha``: the PIT tests pooled and per position (KS, χ² on equal
    cells, surprisal), the stratified ones where ``spec.record``, the two-sample test against ``ref`` where it has
    evidence; with the PIT values [R, L] they saw and (the two-sample verdict, its TV interval), or Nones."""
    rows, length = spec.tokens.shape
    exact = exactness_test_from_scores(scores, rng=_seed(seed, "pit"), alpha=alpha,
                                       positions=np.tile(np.arange(length), rows),  # rows in [R, L] order
                                       min_rows_per_position=min_rows_per_position)
    pit = pit_from_scores(scores, _seed(seed, "pit")).reshape(rows, length)  # the values the test saw
    # The same PIT values on equal cells: the test the detectable-bias figure is computed for.
    binned = [uniformity_chi2(pit.ravel(), alpha=alpha, bins=PIT_BINS, name="pit_chi2[pooled]")]
    if rows >= min_rows_per_position:
        binned += [uniformity_chi2(pit[:, t], alpha=alpha, bins=PIT_BINS, name=f"pit_chi2[position={t}]")
                   for t in range(length)]
    family = list(exact.parts) + binned
    if spec.record is not None:
        family += strata.stratified_tests(pit, scores, spec.record, p_drafts, spec.tokens, alpha=alpha, bins=PIT_BINS,
                                          min_rows=min_rows_per_position)
    if ref is None:
        return family, pit, (None, None)
    two_sample, tv_joint = first_tokens_two_sample(spec, ref, ref.tokens.shape[1], alpha)
    if two_sample.dof:  # dof 0: every outcome pooled into one cell, no evidence either way
        family.append(two_sample)
    return family, pit, (two_sample, tv_joint)


def _detectable(rows: int, length: int, level: float, two_sample: Verdict | None, plain_rows: int) -> dict[str, Any]:
    """The smallest TV shifts detected with power 0.8 at ``level``: what one test of the family is held to at
    Holm's first step (Bonferroni), so the figures hold whatever the other tests find."""
    out: dict[str, Any] = {
        "power": POWER,
        "level": level,
        "pit_bins": PIT_BINS,
        "per_position": detectable_tv(rows, level, POWER, num_categories=PIT_BINS),
        "pooled": detectable_tv(rows * length, level, POWER, num_categories=PIT_BINS),
        "two_sample": None,
        "meaning": f"smallest TV distance from uniform of the PIT law on {PIT_BINS} equal cells, of one position "
                   "(per_position) or of all tokens (pooled), that the PIT chi-square test of this family rejects "
                   "with probability >= power at its Bonferroni level, whatever the shape of the shift "
                   "(stats.detectable_tv). The randomised PIT preserves TV row by row, so a token-level bias of "
                   "that size which moves the same PIT cells in every row is detected too; two_sample: the same "
                   "for the first-tokens test (approximate: treated as one table of dof + 1 cells)",
    }
    if two_sample is not None and two_sample.dof:
        n_eff = max(1, round(rows * plain_rows / (rows + plain_rows)))
        out["two_sample"] = detectable_tv(n_eff, level, POWER, num_categories=int(two_sample.dof) + 1)
    return out


def _banner(bug: str) -> str:
    return (f"PLANTED BUG {bug!r} IS ACTIVE: this decoder is deliberately wrong (a test of the test); "
            "its verdict says whether the test caught it")
