#!/usr/bin/python3
"""GRPO math parity: loss_tool (src/rl/grpo_loss.c) vs a PyTorch implementation of verl's formulas.

usage: /usr/bin/python3 tests/rl/loss_parity.py --tool PATH_TO_LOSS_TOOL --tmp DIR

The reference below re-implements, in PyTorch, verl's verl/trainer/ppo/core_algos.py
(verl-project/verl main, read at commit 018f23b5): compute_grpo_outcome_advantage (the "grpo"
estimator), compute_policy_loss_vanilla, kl_penalty_forward and agg_loss (with its global
batch_num_tokens / global_batch_size / loss_scale_factor arguments left at their defaults, i.e. one
call over the whole mini-batch), combined as verl's dp_actor does: pg_loss + kl_loss_coef * kl_loss.
Gradients are torch autograd w.r.t. logp; DAPO's group filter is verl's "keep when std > 0 or the
group has one sample" with exact equality for "std == 0" (see grpo_loss.h on np.std's rounding).

Inputs are fixed random float32 tensors (seeded); the reference runs in float64 on those same
float32 values, which is what the C code does, so the differences left are rounding order (~1e-15)
and dlogp's float32 output (half an ulp, 6e-8 rel). Tolerances: LOSS_TOL 1e-9 rel (double vs
double), DLOGP_TOL 1e-6 rel per element (float32 output, ~16x its rounding), ADV_TOL 1e-6 rel
(float32 output). Where autograd's gradient is exactly 0 (a clip or clamp holds the value) the C
gradient must be exactly 0 too. For information, and as a check on the loss only (1e-5 rel), the
same reference also runs in float32 as verl does on a GPU.
Prints PASS/FAIL per check and ends with "N passed, M failed"; exit 0 iff all pass.
"""
import argparse
import json
import math
import os
import subprocess
import sys

import numpy as np
import torch

WHITENED = ("reinforce_plus_plus", "reinforce_plus_plus_baseline")
LOSS_TOL = 1e-9
DLOGP_TOL = 1e-6
ADV_TOL = 1e-6
F32_LOSS_TOL = 1e-5

passed = failed = 0


def check(ok, what):
    global passed, failed
    if ok:
        passed += 1
    else:
        failed += 1
    print(("PASS " if ok else "FAIL ") + what)


# ----------------------------------------------------------------------- verl formulas in PyTorch

def masked_sum(x, mask):
    return (x * mask).sum()


def masked_mean(x, mask):
    return (x * mask).sum() / mask.sum()


def grpo_outcome_advantage(scores, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True):
    """verl compute_grpo_outcome_advantage on per-response scores (one scalar each)."""
    scores = scores.clone()
    id2score, id2mean, id2std = {}, {}, {}
    for i in range(scores.shape[0]):
        id2score.setdefault(index[i], []).append(scores[i])
    for idx, vals in id2score.items():
        if len(vals) == 1:
            id2mean[idx] = torch.tensor(0.0, dtype=scores.dtype)
            id2std[idx] = torch.tensor(1.0, dtype=scores.dtype)
        else:
            t = torch.stack(vals)
            id2mean[idx] = torch.mean(t)
            id2std[idx] = torch.std(t)
    for i in range(scores.shape[0]):
        if norm_adv_by_std_in_grpo:
            scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + epsilon)
        else:
            scores[i] = scores[i] - id2mean[index[i]]
    return scores


def kl_penalty_forward(logprob, ref_logprob, kl_penalty):
    if kl_penalty in ("kl", "k1"):
        return logprob - ref_logprob
    if kl_penalty in ("mse", "k2"):
        return 0.5 * (logprob - ref_logprob).square()
    if kl_penalty in ("low_var_kl", "k3"):
        kl = ref_logprob - logprob
        kl = torch.clamp(kl, min=-20, max=20)
        ratio = torch.exp(kl)
        kld = ratio - kl - 1
        return torch.clamp(kld, min=-10, max=10)
    raise NotImplementedError(kl_penalty)


def agg_loss(loss_mat, loss_mask, loss_agg_mode, batch_num_tokens=None, global_batch_size=None,
             loss_scale_factor=None):
    """verl agg_loss with dp_size 1."""
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            batch_num_tokens = loss_mask.sum()
        return masked_sum(loss_mat, loss_mask) / batch_num_tokens
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm"):
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1)
        seq_mask = (torch.sum(loss_mask, dim=-1) > 0).to(loss_mat.dtype)
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        loss = masked_sum(seq_losses, seq_mask) / global_batch_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            if loss_scale_factor is None:
                loss_scale_factor = loss_mask.shape[-1]
            loss = loss / loss_scale_factor
        return loss
    if loss_agg_mode == "seq-mean-token-mean":
        seq_mask = torch.sum(loss_mask, dim=-1)
        seq_losses = torch.sum(loss_mat * loss_mask, dim=-1) / (seq_mask + 1e-8)
        seq_mask = (seq_mask > 0).to(loss_mat.dtype)
        if global_batch_size is None:
            global_batch_size = seq_mask.sum()
        return masked_sum(seq_losses, seq_mask) / global_batch_size
    raise ValueError(loss_agg_mode)


def policy_loss_vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_low, clip_high,
                        clip_ratio_c, loss_scale_factor, rollout_is_weights=None):
    """verl compute_policy_loss_vanilla; clip_ratio_c None = no dual clip (verl always applies its 3.0)."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(ratio.dtype), response_mask)
    if clip_ratio_c is not None:
        pg_losses3 = -advantages * clip_ratio_c
        clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
        pg_clipfrac_lower = masked_mean(torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0).to(ratio.dtype),
                                        response_mask)
        pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    else:
        pg_clipfrac_lower = torch.tensor(0.0, dtype=ratio.dtype)
        pg_losses = clip_pg_losses1
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor=loss_scale_factor)
    return pg_loss, pg_clipfrac, pg_clipfrac_lower, ratio


def policy_loss_gspo(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, rollout_is_weights=None):
    """verl compute_policy_loss_gspo (verl-project/verl 1dda039b): one ratio a sequence; seq-mean-token-mean."""
    negative_approx_kl = log_prob - old_log_prob
    seq_lengths = torch.sum(response_mask, dim=-1).clamp(min=1)
    negative_approx_kl_seq = torch.sum(negative_approx_kl * response_mask, dim=-1) / seq_lengths
    log_seq_importance_ratio = log_prob - log_prob.detach() + negative_approx_kl_seq.detach().unsqueeze(-1)
    log_seq_importance_ratio = torch.clamp(log_seq_importance_ratio, max=10.0)
    seq_importance_ratio = torch.exp(log_seq_importance_ratio)
    pg_losses1 = -advantages * seq_importance_ratio
    pg_losses2 = -advantages * torch.clamp(seq_importance_ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(pg_losses1, pg_losses2)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    pg_clipfrac = masked_mean(torch.gt(pg_losses2, pg_losses1).to(log_prob.dtype), response_mask)
    return pg_loss, pg_clipfrac, torch.tensor(0.0, dtype=log_prob.dtype), seq_importance_ratio


def policy_loss_geo_mean(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high,
                         rollout_is_weights=None):
    """verl compute_policy_loss_geo_mean (GMPO), but the mean over the rows with a token: verl's torch.mean
    over a micro-batch's rows counts empty rows too (and depends on the micro-batch); grpo divides by the
    mini-batch's responses that have a token, as agg_loss's seq-mean modes do."""
    negative_approx_kl = log_prob - old_log_prob
    sgn_advantage = torch.sign(advantages)
    negative_approx_kl_clamp = torch.clamp(negative_approx_kl, -clip_low, clip_high)
    negative_approx_kl_min = torch.min(sgn_advantage * negative_approx_kl, sgn_advantage * negative_approx_kl_clamp)
    negative_approx_kl_min = sgn_advantage * negative_approx_kl_min
    response_mask_sum = response_mask.sum(dim=-1)
    ratio = torch.exp((negative_approx_kl_min * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
    advantage = (advantages * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8)
    pg_losses = -advantage * ratio
    if rollout_is_weights is not None:  # the weights' geometric mean a response
        seq_is_weights = torch.exp(
            (torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1) / (response_mask_sum + 1e-8))
        pg_losses = pg_losses * seq_is_weights
    rows = response_mask_sum > 0
    pg_loss = pg_losses[rows].sum() / rows.sum()
    clipped = torch.ne(negative_approx_kl, negative_approx_kl_clamp)
    pg_clipfrac = masked_mean((clipped * (advantages > 0)).to(log_prob.dtype), response_mask)
    pg_clipfrac_lower = masked_mean((clipped * (advantages < 0)).to(log_prob.dtype), response_mask)
    return pg_loss, pg_clipfrac, pg_clipfrac_lower, ratio[:, None].expand_as(log_prob)


def policy_loss_cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_low, clip_high,
                      loss_scale_factor, rollout_is_weights=None):
    """verl compute_policy_loss_cispo: -sg[clip(ratio)] * A * log_prob."""
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    clipped_ratio = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = -clipped_ratio.detach() * advantages * log_prob
    pg_clipfrac = masked_mean((ratio != clipped_ratio).to(log_prob.dtype), response_mask)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, loss_agg_mode, loss_scale_factor=loss_scale_factor)
    return pg_loss, pg_clipfrac, torch.tensor(0.0, dtype=log_prob.dtype), ratio


def policy_loss_sapo(old_log_prob, log_prob, advantages, response_mask, tau_pos, tau_neg, rollout_is_weights=None):
    """verl compute_policy_loss_sapo: the soft gate sigmoid(tau (r - 1)) 4 / tau; seq-mean-token-mean."""
    tau_pos = torch.as_tensor(tau_pos, dtype=advantages.dtype)
    tau_neg = torch.as_tensor(tau_neg, dtype=advantages.dtype)
    negative_approx_kl = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(negative_approx_kl)
    taus = torch.where(advantages > 0, tau_pos, tau_neg)
    gates = torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus)
    pg_losses = -gates * advantages
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    pg_loss = agg_loss(pg_losses, response_mask, "seq-mean-token-mean")
    zero = torch.tensor(0.0, dtype=log_prob.dtype)
    return pg_loss, zero, zero, ratio


COV_MODES = ("clip_cov", "kl_cov")


def verl_masked_mean(x, mask):
    """verl_F.masked_mean: / (mask.sum() + 1e-8)."""
    return (x * mask).sum() / (mask.sum() + 1e-8)


def policy_loss_clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, clip_low, clip_high,
                         clip_cov_ratio, clip_cov_lb, clip_cov_ub, pick, agg_kw, rollout_is_weights=None):
    """verl compute_policy_loss_clip_cov (verl-project/verl 1dda039b) on one micro-batch, the log-ratio clamped to
    +-20 as grpo does (verl's is not; they differ past it only). pick(candidates as (row, col), clip_num) stands
    for verl's torch.randperm choice. Returns (pg_loss, tokens chosen)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_by_origin = (pg_losses2 > pg_losses1) & (response_mask > 0)
    cov_all = ((advantages - verl_masked_mean(advantages, response_mask)) *
               (log_prob - verl_masked_mean(log_prob.detach(), response_mask))).detach()
    cov_all[response_mask == 0] = -torch.inf
    cov_all[clip_by_origin] = -torch.inf
    clip_num = max(int(clip_cov_ratio * response_mask.sum().item()), 1)
    top_k_idx = torch.nonzero((cov_all < clip_cov_ub) & (cov_all > clip_cov_lb) & (response_mask > 0))
    chosen = pick([tuple(ix) for ix in top_k_idx.tolist()], clip_num)
    corr = torch.ones_like(advantages)
    for b, t in chosen:
        corr[b, t] = 0
    pg_losses = torch.maximum(pg_losses1, pg_losses2) * corr
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kw), len(chosen)


def policy_loss_kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, kl_cov_ratio, ppo_kl_coef,
                       agg_kw, rollout_is_weights=None):
    """verl compute_policy_loss_kl_cov on one micro-batch (its ratio clamped as above). torch.topk's choice among equal
    covariances is unspecified (a micro-batch of one response, or of equal advantages, has all of them 0): here, as in
    grpo, the earlier token; where the k-th and the next differ that is topk's set."""
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(torch.clamp(negative_approx_kl, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * negative_approx_kl.abs()
    valid = response_mask > 0
    all_valid_adv = advantages[valid].detach().reshape(-1)
    all_valid_logp = log_prob[valid].detach().reshape(-1)
    chosen = torch.zeros_like(valid)
    if len(all_valid_adv):
        cov = (all_valid_adv - all_valid_adv.mean()) * (all_valid_logp - all_valid_logp.mean())
        k = max(1, int(len(cov) * kl_cov_ratio))
        top = torch.topk(cov, k, largest=True).indices
        if k < len(cov) and cov[top].min() == torch.topk(cov, k + 1, largest=True).values[k]:  # a tie at the k-th
            top = torch.tensor(sorted(range(len(cov)), key=lambda i: (-float(cov[i]), i))[:k])
        flat = torch.zeros(len(cov), dtype=torch.bool)
        flat[top] = True
        chosen[valid] = flat
    pg_losses = torch.where(chosen, pg_losses_kl, pg_losses1)
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    return agg_loss(pg_losses, response_mask, loss_agg_mode, **agg_kw), int(chosen.sum())


def cov_policy_loss(case, old, logp, adv, mask, is_w, micro, picked):
    """clip_cov / kl_cov as verl's actor runs them: micro-batch by micro-batch (micro: their sizes), each choosing its
    own tokens, aggregated with the mini-batch's totals (global_batch_info). picked: the (row, col) clip_cov chose
    where it had more candidates than clip_num (None: there must not be)."""
    n_tok, n_seq = mask.sum(), (mask.sum(-1) > 0).sum().to(mask.dtype)
    agg_kw = dict(batch_num_tokens=n_tok, global_batch_size=n_seq, loss_scale_factor=case["norm_len"] or None)
    total, n_chosen, b0 = 0.0, 0, 0
    for mb in micro:
        rows = slice(b0, b0 + mb)
        w = is_w[rows] if is_w is not None else None

        def pick(cands, clip_num, b0=b0):
            if len(cands) <= clip_num:
                return cands
            assert picked is not None, f"{case['name']}: {len(cands)} candidates for {clip_num}: a random choice"
            return [(b, t) for b, t in cands if (b + b0, t) in picked]
        if mb and case["mode"] == "clip_cov":
            pg, n = policy_loss_clip_cov(old[rows], logp[rows], adv[rows], mask[rows], case["agg"], case["clip_low"],
                                         case["clip_high"], case.get("clip_cov_ratio", 0.0002), case.get("clip_cov_lb", 1.0),
                                         case.get("clip_cov_ub", 5.0), pick, agg_kw, w)
        elif mb:
            pg, n = policy_loss_kl_cov(old[rows], logp[rows], adv[rows], mask[rows], case["agg"], case.get("kl_cov_ratio", 0.0002),
                                       case.get("ppo_kl_coef", 0.1), agg_kw, w)
        if mb:
            total, n_chosen = total + pg, n_chosen + n
        b0 += mb
    ratio = torch.exp(torch.clamp(logp - old, min=-20.0, max=20.0))
    zero = torch.tensor(0.0, dtype=logp.dtype)
    return total, torch.tensor(n_chosen / float(n_tok), dtype=logp.dtype), zero, ratio


def policy_loss(mode, old, logp, adv, mask, agg, clip_low, clip_high, clip_c, norm_len, tau_pos=1.0, tau_neg=1.05,
                is_w=None):
    """verl's get_policy_loss_fn(mode): (pg_loss, clipfrac, clipfrac_lower, the ratio grpo reports per token);
    is_w: rollout_is_weights."""
    if mode == "vanilla":
        return policy_loss_vanilla(old, logp, adv, mask, agg, clip_low, clip_high, clip_c, norm_len, is_w)
    if mode == "gspo":
        return policy_loss_gspo(old, logp, adv, mask, clip_low, clip_high, is_w)
    if mode == "geo_mean":
        return policy_loss_geo_mean(old, logp, adv, mask, clip_low, clip_high, is_w)
    if mode == "cispo":
        return policy_loss_cispo(old, logp, adv, mask, agg, clip_low, clip_high, norm_len, is_w)
    if mode == "sapo":
        return policy_loss_sapo(old, logp, adv, mask, tau_pos, tau_neg, is_w)
    raise ValueError(mode)


def rollout_correction_weights(log_ratio, response_mask, rollout_is, threshold):
    """verl compute_rollout_correction_weights (rollout_corr_helper.py, verl-project/verl 1dda039b) with one upper
    threshold (TIS): log_ratio = old_log_prob - rollout_log_prob; token: exp(clamp(log_ratio, +-20)); sequence:
    exp(clamp(masked sum, +-20)) on every token; masked, truncated, detached."""
    if rollout_is == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    elif rollout_is == "sequence":
        total = masked_sum_axis(log_ratio, response_mask).unsqueeze(-1)
        raw = torch.exp(torch.clamp(total, min=-20.0, max=20.0)).expand_as(log_ratio)
    else:
        raise ValueError(rollout_is)
    raw = raw * response_mask
    return raw.clamp(max=threshold).detach()


def batch_normalize(w, response_mask, rollout_is):
    """verl compute_rollout_correction_weights' rollout_is_batch_normalize (one process): the weights over their mean
    (token: over the tokens; sequence: over the responses with one), when that is above 1e-8; and the factor."""
    if rollout_is == "token":
        mean = masked_mean(w, response_mask)
    else:
        seq_w = masked_sum_axis(w, response_mask) / (response_mask.sum(-1) + 1e-8)  # verl's masked_mean, axis -1
        seq_mask = (response_mask.sum(dim=-1) > 0).to(w.dtype)
        mean = (seq_w * seq_mask).sum() / seq_mask.sum().clamp_min(1e-8)
    return (w / mean, float(mean)) if mean > 1e-8 else (w, 1.0)


def is_metrics(log_ratio, response_mask, rollout_is, threshold):
    """verl compute_is_metrics (rollout_corr_helper.py, verl-project/verl 1dda039b) for one upper threshold (its lower
    the reciprocal), the batch-wide metrics: mean, std, max, min, effective sample size, fractions high and low."""
    w = rollout_correction_weights(log_ratio, response_mask, rollout_is, threshold)
    mask_bool = response_mask.bool()
    lower = 1.0 / threshold
    if rollout_is == "sequence":
        lr = masked_sum_axis(log_ratio, response_mask).unsqueeze(-1)
        m = dict(rollout_is_max=float(torch.exp(torch.clamp(lr.max(), max=20.0))), rollout_is_min=float(torch.exp(lr.min())),
                 rollout_is_ratio_fraction_high=float((lr > math.log(threshold)).float().mean()),
                 rollout_is_ratio_fraction_low=float((lr < math.log(lower)).float().mean()))
    else:
        raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0)) * response_mask
        m = dict(rollout_is_ratio_fraction_high=float(masked_mean((raw > threshold).to(w.dtype), response_mask)),
                 rollout_is_ratio_fraction_low=float(masked_mean((raw < lower).to(w.dtype), response_mask)),
                 rollout_is_max=float(w.masked_fill(~mask_bool, float("-inf")).max()),
                 rollout_is_min=float(w.masked_fill(~mask_bool, float("inf")).min()))
    m["rollout_is_mean"] = float(masked_mean(w, response_mask))
    wc = w.clamp(min=0.0, max=threshold)
    mean = masked_mean(wc, response_mask)
    var = masked_mean(wc.square(), response_mask) - mean.square()
    m["rollout_is_std"] = float(torch.sqrt(torch.clamp(var, min=0.0))) if response_mask.sum() > 1 else 0.0
    m["rollout_is_eff_sample_size"] = 1.0 / float(masked_mean((wc / (mean + 1e-8)).square(), response_mask))
    return m


def rejection_mask(log_ratio, response_mask, rollout_rs, thresholds):
    """verl compute_rollout_rejection_mask and _parse_rollout_rs_thresholds (rollout_corr_helper.py, verl-project/verl
    1dda039b): the response mask with the rejected tokens 0, and its two batch-wide metrics."""
    options = list(dict.fromkeys(o.strip() for o in rollout_rs.split(",") if o.strip()))
    specs = [p.strip() for p in str(thresholds).split(",") if p.strip()]
    specs = specs * len(options) if len(specs) == 1 else specs
    lr = torch.clamp(log_ratio, min=-20.0, max=20.0)
    k = {"k1": -lr, "k2": 0.5 * lr**2, "k3": torch.exp(lr) - 1.0 - lr}
    n = response_mask.sum(-1)
    combined = torch.ones_like(response_mask)
    for opt, spec in zip(options, specs):
        kind = opt[-2:]
        if kind == "k1":
            lo, hi = (float(x) for x in spec.split("_", 1)) if "_" in spec else (1.0 / float(spec), float(spec))
            keep = lambda v: (v >= math.log(lo)) & (v <= math.log(hi))  # noqa: E731
        else:
            keep = lambda v, hi=float(spec): v <= hi  # noqa: E731
        if opt.startswith("token"):
            ok = keep(k[kind])
        else:
            v = k[kind]
            if opt.startswith("seq_sum"):
                stat = masked_sum_axis(v, response_mask)
            elif opt.startswith("seq_mean"):
                stat = masked_sum_axis(v, response_mask) / (n + 1e-8)
            else:  # seq_max
                m = v.masked_fill(~response_mask.bool(), float("-inf")).max(-1).values
                stat = torch.where(m == float("-inf"), torch.zeros_like(m), m)
            ok = keep(stat).unsqueeze(-1).expand_as(response_mask)
        combined = combined * ok.to(response_mask.dtype)
    valid = response_mask.bool()
    hit = (~((combined > 0.5) & valid) & valid).any(-1)
    metrics = dict(rollout_rs_masked_fraction=float(masked_mean(1 - combined, response_mask)),
                   rollout_rs_seq_masked_fraction=float(hit.float().mean()))
    return response_mask * combined, metrics


def masked_sum_axis(x, mask):
    return torch.where(mask.bool(), x, torch.zeros_like(x)).mul(mask).sum(-1)


def group_scores(scores, index):
    id2score = {}
    for i in range(scores.shape[0]):
        id2score.setdefault(index[i], []).append(scores[i])
    return id2score


def masked_whiten(values, mask):
    """verl_F.masked_whiten: (values - masked_mean) * rsqrt(masked_var (unbiased) + 1e-8)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask) * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def reinforce_pp_returns(scores, token_mask, resp_len):
    """verl compute_reinforce_plus_plus_outcome_advantage's loop (gamma 1) on token rewards holding each score on its
    response's last token (resp_len - 1): masked tokens return 0 and carry the running return through unchanged."""
    B, L = token_mask.shape
    rewards = torch.zeros(B, L, dtype=scores.dtype)
    for i in range(B):
        rewards[i, int(resp_len[i]) - 1] = scores[i]
    returns = torch.zeros_like(rewards)
    running = torch.zeros(B, dtype=scores.dtype)
    for t in reversed(range(L)):
        new = rewards[:, t] + running
        returns[:, t] = new * token_mask[:, t]
        running = new * token_mask[:, t] + running * (1 - token_mask[:, t])
    return returns


def outcome_advantage(estimator, scores, index, lens, epsilon=1e-6, norm_adv_by_std_in_grpo=True, token_mask=None,
                      resp_len=None):
    """verl's outcome estimators (core_algos.py at verl-project/verl 1dda039b) on per-response scores; lens: each
    response's loss tokens (its response_mask's sum), which opo and the whitened ones read. reinforce_plus_plus with
    token_mask (the response mask, 2-D) and resp_len runs verl's returns-to-go over it: each response's value is its
    loss tokens' (all alike at gamma 1), 0 without one."""
    if estimator == "reinforce_plus_plus" and token_mask is not None:
        m = token_mask.to(scores.dtype)
        adv = masked_whiten(reinforce_pp_returns(scores, m, resp_len), m) * m
        has = m.sum(-1) > 0
        first = m.argmax(-1)
        return torch.where(has, adv[torch.arange(adv.shape[0]), first], torch.zeros_like(scores))
    if estimator == "grpo":
        return grpo_outcome_advantage(scores, index, epsilon, norm_adv_by_std_in_grpo)
    scores = scores.clone()
    id2score = group_scores(scores, index)
    mean = {k: (torch.mean(torch.stack(v)) if len(v) > 1 else torch.tensor(0.0, dtype=scores.dtype))
            for k, v in id2score.items()}
    if estimator == "rloo":  # compute_rloo_outcome_advantage
        for i in range(scores.shape[0]):
            n = len(id2score[index[i]])
            if n > 1:
                scores[i] = scores[i] * n / (n - 1) - mean[index[i]] * n / (n - 1)
        return scores
    if estimator == "opo":  # compute_opo_outcome_advantage: the length-weighted group mean
        id2len = group_scores(lens, index)
        id2bsl = {k: torch.tensor(0.0, dtype=scores.dtype) if len(v) == 1 else
                  (torch.stack(id2len[k]) * torch.stack(v)).sum() / torch.stack(id2len[k]).sum()
                  for k, v in id2score.items()}
        for i in range(scores.shape[0]):
            scores[i] = scores[i] - id2bsl[index[i]]
        return scores
    if estimator == "grpo_passk":  # compute_grpo_passk_outcome_advantage
        adv = torch.zeros_like(scores)
        idx_of = group_scores(torch.arange(scores.shape[0]), index)
        for k, v in id2score.items():
            rewards = torch.stack(v)
            topk, topk_idx = torch.topk(rewards, 2)
            a = topk[0] - topk[1]
            if norm_adv_by_std_in_grpo:
                a = a / (torch.std(rewards) + epsilon)
            adv[int(idx_of[k][topk_idx[0].item()])] = a
        return adv
    # reinforce_plus_plus (gamma 1: every token's return is the score) and reinforce_plus_plus_baseline: the
    # per-token values whitened over the batch's response mask, one token per column here
    L = int(max(lens).item()) if len(lens) else 1
    mask = torch.zeros(scores.shape[0], max(L, 1), dtype=scores.dtype)
    for i, n in enumerate(lens.tolist()):
        mask[i, :int(n)] = 1
    if estimator == "reinforce_plus_plus_baseline":
        for i in range(scores.shape[0]):
            scores[i] = scores[i] - mean[index[i]]
    elif estimator != "reinforce_plus_plus":
        raise ValueError(estimator)
    return (masked_whiten(scores[:, None] * mask, mask) * mask)[:, 0]


def reference_loss(case, dtype, micro=None, picked=None):
    """The actor's loss for one mini-batch in one call, and d loss / d logp per sequence. clip_cov / kl_cov choose
    their tokens per micro-batch: micro (sizes; None: one) and picked as cov_policy_loss's."""
    rows = case["logp"]
    B, T = len(rows), max(1, max(len(r) for r in rows))

    def pad(key):
        x = torch.zeros(B, T, dtype=dtype)
        for b, r in enumerate(case[key]):
            x[b, :len(r)] = torch.tensor(r, dtype=torch.float32).to(dtype)
        return x

    mask = torch.zeros(B, T, dtype=dtype)
    for b, r in enumerate(rows):
        mask[b, :len(r)] = torch.tensor(case["mask"][b], dtype=dtype) if "mask" in case else 1
    logp = pad("logp").requires_grad_(True)
    old = pad("old_logp")
    adv = torch.tensor(case["adv"], dtype=torch.float32).to(dtype)[:, None].expand(B, T)
    clip_c = case["clip_c"] if case["clip_c"] else None
    norm_len = case["norm_len"] if case["norm_len"] else None
    is_w = pad("is_w") if "is_w" in case else None
    if case.get("mode") in COV_MODES:
        pg_loss, clipfrac, clipfrac_lower, ratio = cov_policy_loss(case, old, logp, adv, mask, is_w, micro or [B],
                                                                   picked)
    else:
        pg_loss, clipfrac, clipfrac_lower, ratio = policy_loss(
            case.get("mode", "vanilla"), old, logp, adv, mask, case["agg"], case["clip_low"], case["clip_high"],
            clip_c, norm_len, case.get("tau_pos", 1.0), case.get("tau_neg", 1.05), is_w)
    loss, kl_loss = pg_loss, torch.tensor(0.0, dtype=dtype)
    if case.get("ref_logp") is not None:
        kld = kl_penalty_forward(logp, pad("ref_logp"), case["kl"])
        kl_loss = agg_loss(kld, mask, case["agg"], loss_scale_factor=norm_len)
        loss = pg_loss + kl_loss * case["kl_coef"]
    ent_loss, ent = torch.tensor(0.0, dtype=dtype), None
    if case.get("entropy") is not None:  # verl dp_actor: policy_loss = pg_loss - entropy_loss * entropy_coeff
        ent = pad("entropy").requires_grad_(True)
        ent_loss = agg_loss(ent, mask, case["agg"], loss_scale_factor=norm_len)
        loss = loss - ent_loss * case.get("entropy_coeff", 0.0)
    loss.backward()
    valid = mask > 0
    return dict(loss=loss.item(), pg_loss=pg_loss.item(), kl=kl_loss.item(), clip_frac=clipfrac.item(),
                clip_frac_lower=clipfrac_lower.item(),
                ratio_min=ratio.detach()[valid].min().item(), ratio_max=ratio.detach()[valid].max().item(),
                n_tokens=int(mask.sum().item()), entropy=ent_loss.item(),
                dlogp=[logp.grad[b, :len(r)].tolist() for b, r in enumerate(rows)],
                dent=[ent.grad[b, :len(r)].tolist() for b, r in enumerate(rows)] if ent is not None else None)


# ----------------------------------------------------------------------------------- fixed inputs

def f32(x):
    return [float(v) for v in np.asarray(x, dtype=np.float32)]


def make_batch(gen, lengths, old_sd=0.15, ref_sd=0.5, extremes=False, same_old=False, adv_zero=()):
    """Sequences of logp / old_logp / ref_logp and one advantage per sequence, all float32-exact."""
    logp, old, ref = [], [], []
    for L in lengths:
        lp = -5.0 * torch.rand(L, generator=gen, dtype=torch.float64)
        od = lp if same_old else lp + old_sd * torch.randn(L, generator=gen, dtype=torch.float64)
        rf = lp + ref_sd * torch.randn(L, generator=gen, dtype=torch.float64)
        logp.append(f32(lp)), old.append(f32(od)), ref.append(f32(rf))
    adv = 1.5 * torch.randn(len(lengths), generator=gen, dtype=torch.float64)
    adv = [0.0 if i in adv_zero else a for i, a in enumerate(f32(adv))]
    if extremes:
        # Past every clamp, in the two longest sequences: b (A < 0) and b2 (A > 0).
        b, b2 = sorted(range(len(lengths)), key=lambda i: -lengths[i])[:2]
        adv[b], adv[b2] = f32([-abs(adv[b]) - 0.5, abs(adv[b2]) + 0.5])
        lp = logp[b]
        old[b][0] = lp[0] - 25.0  # log-ratio +25 > 20, A < 0: the dual clip holds it (or, off, the clamp)
        ref[b][2], ref[b][3] = lp[2] + 4.0, lp[3] - 12.0  # k3 = e^t - t - 1 capped at 10 (t > 2.62, t < -11)
        old[b][5] = lp[5] - 1.5  # ratio e^1.5 > clip_c = 3 with A < 0: dual clip
        old[b2][0] = logp[b2][0] + 25.0  # log-ratio -25, A > 0: unclipped, only verl's clamp zeroes the gradient
    return dict(logp=logp, old_logp=old, ref_logp=ref, adv=adv)


def groups8_list(rnd):
    """Six groups of 8: binary, all 0, all 1, all 0.1 (non-dyadic), continuous (rnd), mixed signs."""
    return [1, 0, 0, 1, 1, 0, 1, 0] + [0] * 8 + [1] * 8 + [0.1] * 8 + rnd[:8] + [0.5, 2, -1, 3, 0.25, 0, 7, -3]


def build_cases():
    gen = torch.Generator().manual_seed(20250611)
    cases = []
    lengths = [7, 1, 13, 0, 4, 9, 2, 11]  # a lone token and an empty (fully masked) sequence
    micro = [2, 1, 0, 3, 2]                # uneven micro-batches, one of them empty
    base = make_batch(gen, lengths, extremes=True, adv_zero=(6,))
    for kl in ("k1", "k2", "k3"):
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            cases.append(dict(base, name=f"{kl}/{agg}/clip-higher+dual", kind="loss", kl=kl, agg=agg,
                              clip_low=0.2, clip_high=0.28, clip_c=3.0, kl_coef=0.1, norm_len=16.0, micro=micro))
    big = make_batch(gen, [int(n) for n in torch.randint(1, 60, (24,), generator=gen)], old_sd=0.3)
    cases.append(dict(big, name="k3/token-mean/default-0.001/24-seqs", kind="loss", kl="k3", agg="token-mean",
                      clip_low=0.2, clip_high=0.2, clip_c=0.0, kl_coef=0.001, norm_len=0.0, micro=[5, 7, 12]))
    for alias, agg in (("low_var_kl", "seq-mean-token-mean"), ("mse", "token-mean"), ("kl", "seq-mean-token-sum-norm")):
        cases.append(dict(base, name=f"alias-{alias}/{agg}", kind="loss", kl=alias, agg=agg, clip_low=0.2,
                          clip_high=0.2, clip_c=0.0, kl_coef=0.05, norm_len=20.0, micro=[8]))
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        nokl = {k: v for k, v in base.items() if k != "ref_logp"}
        cases.append(dict(nokl, name=f"kl_coef-0-no-ref/{agg}", kind="loss", kl="k3", agg=agg, clip_low=0.2,
                          clip_high=0.2, clip_c=3.0, kl_coef=0.0, norm_len=16.0, micro=[3, 5]))
    # The entropy bonus (verl entropy_coeff) in every aggregation, with KL and clipping active.
    ents = [f32(3.0 * torch.rand(L, generator=gen, dtype=torch.float64)) for L in lengths]
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        cases.append(dict(base, entropy=ents, entropy_coeff=0.01, name=f"entropy-bonus/{agg}", kind="loss", kl="k3",
                          agg=agg, clip_low=0.2, clip_high=0.28, clip_c=3.0, kl_coef=0.1, norm_len=16.0, micro=micro))
    on_policy = make_batch(gen, lengths, same_old=True)
    for agg in ("token-mean", "seq-mean-token-mean"):
        cases.append(dict(on_policy, name=f"ratio-exactly-1/{agg}", kind="loss", kl="k3", agg=agg, clip_low=0.2,
                          clip_high=0.28, clip_c=3.0, kl_coef=0.001, norm_len=0.0, micro=[4, 4]))
    # Multi-turn rollout: tool tokens inside the responses have response_mask 0 (and one response is all tool
    # tokens), in every aggregation, with KL, entropy and clipping active.
    tool_mask = []
    for b, L in enumerate(lengths):
        mk = [1] * L
        for i in range(2, L - 1, 3 + b % 2):  # holes of one or two tokens
            mk[i] = 0
            if b % 2 and i + 1 < L:
                mk[i + 1] = 0
        tool_mask.append(mk if b != 5 else [0] * L)
    for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        cases.append(dict(base, entropy=ents, entropy_coeff=0.01, mask=tool_mask, name=f"tool-mask/{agg}",
                          kind="loss", kl="k3", agg=agg, clip_low=0.2, clip_high=0.28, clip_c=3.0, kl_coef=0.1,
                          norm_len=16.0, micro=micro))
    # Advantages from verl's estimator itself (float64 over float32 rewards) with a flat group: A = 0.
    rew = make_batch(gen, [5] * 8, old_sd=0.25)
    r = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    rew["adv"] = f32(grpo_outcome_advantage(torch.tensor(r, dtype=torch.float64), [0] * 4 + [1] * 4).tolist())
    cases.append(dict(rew, name="grpo-adv-with-flat-group/token-mean", kind="loss", kl="k2", agg="token-mean",
                      clip_low=0.2, clip_high=0.28, clip_c=3.0, kl_coef=0.01, norm_len=0.0, micro=[3, 3, 2]))

    # Advantages: binary and continuous rewards, flat groups (0s, 1s, non-dyadic 0.1s), G = 1, 2, 8.
    rnd = f32(torch.rand(16, generator=gen, dtype=torch.float64))
    groups8 = groups8_list(rnd)
    for norm in (True, False):
        tag = "std" if norm else "dr-grpo"
        cases.append(dict(name=f"adv/G8/{tag}", kind="adv", rewards=f32(groups8), G=8, norm_by_std=norm, eps=1e-6))
        cases.append(dict(name=f"adv/G2/{tag}", kind="adv", rewards=f32([1, 0, 1, 1, 0.3, -0.7]), G=2,
                          norm_by_std=norm, eps=1e-6))
        cases.append(dict(name=f"adv/G1/{tag}", kind="adv", rewards=f32([1, 0, 0.75]), G=1, norm_by_std=norm,
                          eps=1e-6))
    cases.append(dict(name="adv/G4/eps-0.1", kind="adv", rewards=f32(rnd[8:16]), G=4, norm_by_std=True, eps=0.1))

    # 2025's policy losses (verl's loss_mode) on the same off-policy batch with its clamps, in every aggregation
    # (gspo's and sapo's policy term is seq-mean-token-mean whatever the mode, their KL and entropy follow it),
    # with KL and the entropy bonus, whole and in micro-batches; and with the tool mask.
    for mode in ("gspo", "geo_mean", "cispo", "sapo"):
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            cases.append(dict(base, entropy=ents, entropy_coeff=0.01, name=f"{mode}/{agg}", kind="loss", mode=mode,
                              kl="k3", agg=agg, clip_low=0.2, clip_high=0.28, clip_c=0.0, kl_coef=0.1, norm_len=16.0,
                              micro=micro))
        cases.append(dict(base, mask=tool_mask, name=f"{mode}/tool-mask", kind="loss", mode=mode, kl="k2",
                          agg="seq-mean-token-mean", clip_low=0.1, clip_high=0.3, clip_c=0.0, kl_coef=0.05,
                          norm_len=0.0, micro=[3, 5], tau_pos=2.0, tau_neg=0.5))
    # GSPO's paper clips the sequence ratio at 3e-4 / 4e-4: most sequences clip
    cases.append(dict(big, name="gspo/paper-clip", kind="loss", mode="gspo", kl="k3", agg="seq-mean-token-mean",
                      clip_low=3e-4, clip_high=4e-4, clip_c=0.0, kl_coef=0.0, norm_len=0.0, micro=[5, 7, 12]))
    # The rollout correction's weights (verl's rollout_is_weights: truncated at 2, some 0 for masked tokens) in every
    # loss mode: each token's policy term times its weight, geo_mean's times the geometric mean of the response's.
    is_w = [f32(torch.clamp(torch.exp(0.3 * torch.randn(L, generator=gen, dtype=torch.float64)), max=2.0)) for L in lengths]
    for mode in ("vanilla", "gspo", "geo_mean", "cispo", "sapo"):
        cases.append(dict(base, is_w=is_w, mask=tool_mask, entropy=ents, entropy_coeff=0.01, name=f"rollout-is/{mode}",
                          kind="loss", mode=mode, kl="k3", agg="token-mean", clip_low=0.2, clip_high=0.28,
                          clip_c=3.0 if mode == "vanilla" else 0.0, kl_coef=0.1, norm_len=0.0, micro=micro))
    # Clip-Cov and KL-Cov (verl's clip_cov / kl_cov), each micro-batch choosing its own tokens by the covariance of
    # advantage and log p: clip_cov_ratio 1 makes clip_num every token, so all in the window lose their gradient (no
    # random choice); kl_cov's top 10% get 0.5 |log r|. With KL, entropy and the extremes past the clamps; and with
    # the tool mask and rollout weights.
    cov_kw = dict(clip_cov_ratio=1.0, clip_cov_lb=0.3, clip_cov_ub=2.5, kl_cov_ratio=0.1, ppo_kl_coef=0.5)
    for mode in COV_MODES:
        for agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
            cases.append(dict(base, entropy=ents, entropy_coeff=0.01, name=f"{mode}/{agg}", kind="loss", mode=mode,
                              kl="k3", agg=agg, clip_low=0.2, clip_high=0.28, clip_c=0.0, kl_coef=0.1, norm_len=16.0,
                              micro=micro, **cov_kw))
        cases.append(dict(base, is_w=is_w, mask=tool_mask, name=f"{mode}/tool-mask-rollout-is", kind="loss", mode=mode,
                          kl="k2", agg="seq-mean-token-mean", clip_low=0.1, clip_high=0.3, clip_c=0.0, kl_coef=0.05,
                          norm_len=0.0, micro=[3, 5], **cov_kw))
        # verl's ratios (0.0002: one token a micro-batch), clip_cov's window wide open
        cases.append(dict(big, name=f"{mode}/defaults", kind="loss", mode=mode, kl="k3", agg="token-mean",
                          clip_low=0.2, clip_high=0.2, clip_c=0.0, kl_coef=0.0, norm_len=0.0, micro=[5, 7, 12],
                          clip_cov_lb=-100.0, clip_cov_ub=100.0, random_choice=mode == "clip_cov", count_check=True))
    # clip_cov's random choice: 5% of the tokens among many more candidates; the reference takes the tokens grpo chose
    # (those of gradient 0) and the checks are that they are candidates, as many as clip_num, and the loss verl's
    # seeds 7, 8 and 7 again: another seed chooses other tokens, the same seed the same (random_seeds, in main)
    for seed, tag in ((7, ""), (8, "-seed-8"), (7, "-seed-7-again")):
        cases.append(dict(big, name="clip_cov/random-choice" + tag, kind="loss", mode="clip_cov", kl="k3",
                          agg="token-mean", clip_low=0.2, clip_high=0.2, clip_c=0.0, kl_coef=0.0, norm_len=0.0,
                          micro=[5, 7, 12], clip_cov_ratio=0.05, clip_cov_lb=-100.0, clip_cov_ub=100.0, cov_seed=seed,
                          random_choice=True, count_check=True))
    # Outcome advantage estimators (verl's adv_estimator) on binary, continuous and flat groups; opo and the
    # whitened ones weigh responses by their loss tokens (a zero-length one among them).
    lens8 = [float(n) for n in torch.randint(1, 40, (48,), generator=gen)]
    lens8[5] = 0.0
    for est in ("rloo", "opo", "grpo_passk", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        for norm in (True, False) if est == "grpo_passk" else (True,):
            cases.append(dict(name=f"adv/{est}/G8" + ("" if norm else "/no-std"), kind="adv", estimator=est,
                              rewards=f32(groups8_list(rnd)), len=lens8, G=8, norm_by_std=norm, eps=1e-6))
        cases.append(dict(name=f"adv/{est}/G2", kind="adv", estimator=est, rewards=f32([1, 0, 1, 1, 0.3, -0.7]),
                          len=[3.0, 9.0, 4.0, 4.0, 12.0, 1.0], G=2, norm_by_std=True, eps=1e-6))

    cases.append(dict(name="parse", kind="parse",
                      kl=["k1", "kl", "k2", "mse", "k3", "low_var_kl", "k3+", "abs", "full", "K3", ""],
                      agg=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm", "seq-mean-token-sum",
                           "token-sum", "Token-Mean", ""]))
    return cases


# ------------------------------------------------------------------------------------ comparisons

def rel_err(c, t):
    return abs(c - t) / max(1.0, abs(t))


def zero_grads(dlogp):
    """(row, col) of the tokens whose gradient grpo left at exactly 0."""
    return {(b, t) for b, row in enumerate(dlogp) for t, v in enumerate(row) if v == 0.0}


def compare_loss(case, out):
    name, cov = case["name"], case.get("mode") in COV_MODES
    # clip_cov's random choice, where it had one to make (kl_coef 0, no entropy: a chosen token's gradient is 0)
    picked = zero_grads(out["dlogp"]) if case.get("random_choice") else None
    ref = reference_loss(case, torch.float64, picked=picked)
    ref32 = reference_loss(case, torch.float32, picked=picked)
    compare_outputs(name, out["loss"], out["stats"], out["dlogp"], out.get("dent"), ref, ref32)
    if cov and len(case["micro"]) > 1:  # each micro-batch chooses its own tokens, as verl's
        picked = zero_grads(out["micro_dlogp"]) if case.get("random_choice") else None
        refm = reference_loss(case, torch.float64, case["micro"], picked)
        refm32 = reference_loss(case, torch.float32, case["micro"], picked)
        compare_outputs(f"{name} in micro-batches {case['micro']}", out["micro_loss_sum"], out["micro_stats"],
                        out["micro_dlogp"], out.get("dent"), refm, refm32)
        return ref
    compare_micro(case, out)
    return ref


def compare_outputs(name, loss, stats, dlogp, dent, ref, ref32):
    out = dict(loss=loss, stats=stats, dlogp=dlogp, dent=dent)
    e = rel_err(out["loss"], ref["loss"])
    check(e <= LOSS_TOL, f"{name}: loss {out['loss']:.12g} vs torch {ref['loss']:.12g} (rel {e:.2e})")
    for k in ("pg_loss", "kl", "clip_frac", "clip_frac_lower", "ratio_min", "ratio_max", "entropy"):
        e = rel_err(out["stats"][k], ref[k])
        check(e <= LOSS_TOL, f"{name}: stats.{k} {out['stats'][k]:.10g} vs torch {ref[k]:.10g} (rel {e:.2e})")
    check(out["stats"]["n_tokens"] == ref["n_tokens"], f"{name}: stats.n_tokens {out['stats']['n_tokens']}")
    check(abs(out["stats"]["loss"] - out["loss"]) == 0, f"{name}: stats.loss equals the returned loss")

    flat_c = [v for row in out["dlogp"] for v in row]
    flat_t = [v for row in ref["dlogp"] for v in row]
    scale = max([abs(v) for v in flat_t] + [1e-30])
    worst, zero_miss = 0.0, 0
    for c, t in zip(flat_c, flat_t):
        if c is None or math.isnan(c):
            worst = math.inf
            continue
        worst = max(worst, abs(c - t) / max(abs(t), 1e-6 * scale))
        zero_miss += (t == 0.0) != (c == 0.0)
    check(len(flat_c) == len(flat_t) and worst <= DLOGP_TOL,
          f"{name}: dlogp vs autograd, worst rel {worst:.2e} over {len(flat_t)} tokens (max |g| {scale:.3g})")
    check(zero_miss == 0, f"{name}: dlogp exactly 0 where autograd's is ({sum(t == 0.0 for t in flat_t)} tokens), "
                          f"{zero_miss} mismatches")
    if ref["dent"] is not None:
        fc = [v for row in out["dent"] for v in row]
        ft = [v for row in ref["dent"] for v in row]
        worst = max([abs(c - t) / max(abs(t), 1e-30) if c is not None else math.inf for c, t in zip(fc, ft)] + [0.0])
        check(len(fc) == len(ft) and worst <= DLOGP_TOL,
              f"{name}: d loss / d entropy vs autograd, worst rel {worst:.2e} over {len(ft)} tokens")
    e32 = rel_err(out["loss"], ref32["loss"])
    check(e32 <= F32_LOSS_TOL, f"{name}: loss vs float32 torch (verl's dtype) rel {e32:.2e}")
    g32 = max([abs(c - t) for c, t in zip(flat_c, [v for row in ref32["dlogp"] for v in row])] + [0.0]) / scale
    print(f"info {name}: dlogp vs float32 torch, max diff / max |g| = {g32:.2e}")


def compare_micro(case, out):
    name = case["name"]
    # Micro-batches with the mini-batch's totals add up to the single call.
    e = abs(out["micro_loss_sum"] - out["loss"]) / max(1.0, abs(out["loss"]))
    check(e <= 1e-12, f"{name}: micro-batches {case['micro']} sum to the loss (rel {e:.1e})")
    check(out["micro_dlogp"] == out["dlogp"], f"{name}: micro-batch dlogp identical to the single call")
    ms, ws = out["micro_stats"], out["stats"]
    same = all(abs(ms[k] - ws[k]) <= 1e-12 * max(1.0, abs(ws[k])) for k in ("loss", "pg_loss", "kl", "clip_frac", "entropy",
                                                                         "clip_frac_lower"))
    same = same and ms["ratio_min"] == ws["ratio_min"] and ms["ratio_max"] == ws["ratio_max"] \
        and ms["n_tokens"] == ws["n_tokens"]
    check(same, f"{name}: micro-batch stats (grpo_loss_stats_add) equal the single call's")


def compare_adv(case, out):
    name, G, est = case["name"], case["G"], case.get("estimator", "grpo")
    r = torch.tensor(case["rewards"], dtype=torch.float32).to(torch.float64)
    index = [i // G for i in range(len(case["rewards"]))]
    lens = torch.tensor(case.get("len", [0.0] * len(case["rewards"])), dtype=torch.float64)
    ref = outcome_advantage(est, r, index, lens, case["eps"], case["norm_by_std"]).tolist()
    # whitened: a response without loss tokens has no advantage in verl (its mask is 0); grpo's is not read
    live = [i for i in range(len(ref)) if est not in WHITENED or lens[i] > 0]
    worst = max(abs(out["adv"][i] - ref[i]) / max(1.0, abs(ref[i])) for i in live)
    check(len(out["adv"]) == len(ref) and worst <= ADV_TOL,
          f"{name}: advantages vs verl {est} estimator, worst rel {worst:.2e} over {len(live)} responses")
    if est != "grpo":
        return
    ref32 = grpo_outcome_advantage(torch.tensor(case["rewards"], dtype=torch.float32), index, case["eps"],
                                   case["norm_by_std"]).tolist()
    print(f"info {name}: vs float32 torch max diff {max(abs(c - t) for c, t in zip(out['adv'], ref32)):.2e}")
    flat_ref = []
    for g in range(len(case["rewards"]) // G):
        vals = np.asarray(case["rewards"][g * G:(g + 1) * G], dtype=np.float32)
        keep = vals.max() != vals.min() or len(vals) == 1  # verl: std > 0 or a single sample
        flat_ref.append(0 if keep else 1)
        if not keep:
            zeros = all(a == 0.0 for a in out["adv"][g * G:(g + 1) * G])
            check(zeros, f"{name}: flat group {g} ({vals[0]:g} x{G}) has advantage exactly 0")
            if np.std(np.float64(vals)) > 0:
                print(f"info {name}: group {g} is flat but np.std in float64 gives {np.std(np.float64(vals)):.1e}")
    check(out["flat"] == flat_ref, f"{name}: flat groups {out['flat']} vs verl filter {flat_ref}")


def compare_parse(case, out):
    # verl kl_penalty_forward's names (k1+/k3+ straight-through, abs and full are not supported here).
    kl_want = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3"}
    agg_want = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
    kl_ids = {n: i for n, i in zip(case["kl"], out["kl"])}
    ok = all((kl_ids[n] == kl_ids[kl_want[n]] and kl_ids[n] >= 0) if n in kl_want else kl_ids[n] == -1
             for n in case["kl"])
    ok = ok and len({kl_ids["k1"], kl_ids["k2"], kl_ids["k3"]}) == 3
    check(ok, f"parse: KL names and aliases {dict(zip(case['kl'], out['kl']))}")
    agg_ids = dict(zip(case["agg"], out["agg"]))
    ok = all((agg_ids[n] >= 0) == (n in agg_want) for n in case["agg"])
    ok = ok and len({agg_ids[n] for n in agg_want}) == 3
    check(ok, f"parse: aggregation names {agg_ids}")


RS_OPTIONS = ["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3", "seq_mean_k1",
              "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3"]


def rs_checks(args):
    """Rejection sampling (rollout_rs_apply) against the port of verl's compute_rollout_rejection_mask, every option
    alone and chained, on log ratios around the bounds; the threshold forms verl refuses, refused."""
    g = torch.Generator().manual_seed(11)
    B, L = 24, 9
    old = (torch.randn(B, L, generator=g, dtype=torch.float64) * 0.05 - 1.0).float().double()
    roll = (old + torch.randn(B, L, generator=g, dtype=torch.float64) * 0.02).float().double()
    lens = torch.randint(1, L + 1, (B,), generator=g)
    mask = (torch.arange(L)[None, :] < lens[:, None]).double()
    mask[3, :2] = 0  # a tool's tokens
    mask[5] = 0  # a response with no loss token
    # bounds near the statistics' quantiles: each option rejects some tokens and keeps others
    thr = {"k1": "0.985_1.02", "k2": "0.0002", "k3": "0.0002"}
    seq_thr = {"seq_sum_k1": "0.9_1.1", "seq_sum_k2": "0.001", "seq_sum_k3": "0.001", "seq_mean_k1": "0.99_1.01"}
    cases = []
    for opts in [[o] for o in RS_OPTIONS] + [["token_k1", "seq_max_k3"], ["seq_mean_k2", "token_k3", "seq_sum_k1"]]:
        spec = ",".join(seq_thr.get(o, thr[o[-2:]]) for o in opts)
        cases.append(dict(name="rs " + ",".join(opts), kind="rs", rollout_rs=", ".join(opts), thresholds=spec,
                          old=[old[b, :lens[b]].tolist() for b in range(B)],
                          rollout=[roll[b, :lens[b]].tolist() for b in range(B)],
                          mask=[mask[b, :lens[b]].tolist() for b in range(B)]))
    cases.append(dict(cases[-2], name="rs one threshold for all", thresholds="1.02"))  # token_k1, seq_max_k3
    bad = [("token_k4", "2"), ("token_k2", "0.5_2"), ("token_k1,seq_max_k3", "2,3,4"), ("seq_sum_k1", "3_2"),
           ("token_k1", "-1"), ("token_k1", "x"), ("", "2"), ("token_k2", "2" * 64)]
    for opts, spec in bad:
        cases.append(dict(cases[0], name=f"rs refused {opts!r} {spec[:12]!r}", rollout_rs=opts, thresholds=spec))
    p, outs = run_tool(args.tool, args.tmp, cases, "rs")
    check(p.returncode == 0 and outs is not None, f"loss_tool ran the rejection cases (rc {p.returncode}) {p.stderr}")
    for case, out in zip(cases, outs or []):
        if case["name"].startswith("rs refused"):
            check("error" in out, f"{case['name']}: refused ({out.get('error')})")
            continue
        want, _ = rejection_mask(old - roll, mask, case["rollout_rs"], case["thresholds"])
        got = [x for row in out.get("mask", []) for x in row]
        exp = [int(want[b, t]) for b in range(B) for t in range(int(lens[b]))]
        n_rej = int(mask.sum() - want.sum())
        check(got == exp and 0 < n_rej < mask.sum() and out["rejected"] == n_rej,
              f"{case['name']}: the mask verl's port gives ({n_rej} of {int(mask.sum())} rejected)")


def run_tool(tool, tmp, cases, tag):
    inp, outp = os.path.join(tmp, f"{tag}_in.json"), os.path.join(tmp, f"{tag}_out.json")
    with open(inp, "w") as f:
        json.dump({"cases": cases}, f)
    p = subprocess.run([tool, inp, outp], capture_output=True, text=True)
    out = None
    if p.returncode == 0:
        with open(outp) as f:
            out = json.load(f)["cases"]
    return p, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--tmp", required=True)
    args = ap.parse_args()
    os.makedirs(args.tmp, exist_ok=True)
    torch.set_num_threads(1)

    cases = build_cases()
    p, outs = run_tool(args.tool, args.tmp, cases, "parity")
    check(p.returncode == 0, f"loss_tool ran on {len(cases)} cases (rc {p.returncode}) {p.stderr.strip()}")
    if outs is None:
        print(f"{passed} passed, {failed} failed")
        sys.exit(1)
    for case, out in zip(cases, outs):
        assert out["name"] == case["name"]
        if case["kind"] == "loss":
            ref = compare_loss(case, out)
            if case["name"].startswith("ratio-exactly-1"):
                check(out["stats"]["clip_frac"] == 0.0 and out["stats"]["clip_frac_lower"] == 0.0
                      and ref["clip_frac"] == 0.0, f"{case['name']}: clip fraction exactly 0 (torch too)")
                check(out["stats"]["ratio_all_one"] and ref["ratio_min"] == 1.0 == ref["ratio_max"],
                      f"{case['name']}: ratio min = max = 1 exactly (torch too)")
            if case.get("count_check"):  # as many as clip_num (kl_cov: k), in the single call
                n_tok = out["stats"]["n_tokens"]
                want = max(int(case.get(case["mode"] + "_ratio", 0.0002) * n_tok), 1)
                got = round(out["stats"]["clip_frac"] * n_tok)
                check(got == want, f"{case['name']}: {got} tokens chosen of {n_tok}, verl's clip_num {want}")
            if "clip-higher" in case["name"]:
                check(out["stats"]["clip_frac"] > 0 and out["stats"]["clip_frac_lower"] > 0,
                      f"{case['name']}: the inputs exercise both clips "
                      f"({out['stats']['clip_frac']:.3f}, {out['stats']['clip_frac_lower']:.3f})")
        elif case["kind"] == "adv":
            compare_adv(case, out)
        else:
            compare_parse(case, out)

    chosen = {c["name"]: zero_grads(o["dlogp"]) for c, o in zip(cases, outs) if c["name"].startswith("clip_cov/random")}
    a, b, c = (chosen["clip_cov/random-choice" + t] for t in ("", "-seed-8", "-seed-7-again"))
    check(a == c and a != b, f"clip_cov/random-choice: seed 7 chooses the same {len(a)} zero-gradient tokens twice, "
                             f"seed 8 others ({len(a & b)} in common)")

    rs_checks(args)

    # Inconsistent inputs fail with one "grpo: error:" line naming the problem.
    base = next(c for c in cases if c["kind"] == "loss")
    nokl = {k: v for k, v in base.items() if k != "ref_logp"}
    bad = [("unknown-kl", dict(base, kl="k4"), "k4"),
           ("kl-without-ref", dict(nokl, kl_coef=0.1), "reference"),
           ("clip_c-below-1", dict(base, clip_c=0.5), "clip_ratio_c"),
           ("clip_cov-window", dict(base, mode="clip_cov", clip_c=0.0, clip_cov_lb=5.0, clip_cov_ub=5.0), "clip_cov_lb"),
           ("sum-norm-without-length", dict(base, agg="seq-mean-token-sum-norm", norm_len=0.0), "normalising length")]
    for tag, case, needle in bad:
        p, _ = run_tool(args.tool, args.tmp, [dict(case, name=tag)], "bad_" + tag)
        err = p.stderr.strip()
        check(p.returncode == 1 and err.startswith("grpo: error:") and needle in err and "\n" not in err,
              f"bad input {tag}: rc {p.returncode}, {err!r}")

    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
