"""Vectorised next-token sampling for the transformers backend: greedy, tempered and top-p rows
in one call, each row drawn with its own uniform number so that a request's sample does not
depend on what else is in its batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sample_tokens(
    logits: Any,
    temperatures: Sequence[float],
    top_ps: Sequence[float],
    uniforms: Sequence[float],
    raw_logprobs: bool = False,
) -> tuple[Any, Any]:
    """One next token per row of ``logits`` (``[rows, vocab]``), vectorised over the rows.

    Row ``i`` is greedy when ``temperatures[i] == 0``; otherwise it is sampled from the softmax
    of ``logits[i] / temperatures[i]`` restricted to its top-p nucleus (the most likely tokens
    whose preceding cumulative mass is below ``top_ps[i]``) by inverse transform sampling with
    the uniform draw ``uniforms[i]`` in ``[0, 1)``: the token where the cumulative distribution
    (most likely first for top-p rows, vocabulary order otherwise) first exceeds it. One draw per
    row and step from the row's own generator is what makes a request's sample independent of
    its batch. Returns ``(tokens, logprobs)`` on the device of ``logits``: the log-probability
    of each token under the distribution it was drawn from, or under the unmodified model
    distribution with ``raw_logprobs`` (greedy rows always report the latter).
    """
    import torch

    logits = logits.float()
    device = logits.device
    tokens = torch.empty(logits.shape[0], dtype=torch.long, device=device)
    logprobs = torch.empty(logits.shape[0], dtype=torch.float32, device=device)
    greedy = [row for row, temperature in enumerate(temperatures) if temperature == 0]
    plain = [row for row, t in enumerate(temperatures) if t > 0 and top_ps[row] >= 1.0]
    nucleus = [row for row, t in enumerate(temperatures) if t > 0 and top_ps[row] < 1.0]
    if greedy:
        index = torch.tensor(greedy, device=device)
        rows = logits[index]
        chosen = rows.argmax(-1)
        tokens[index], logprobs[index] = chosen, _token_logprobs(rows, chosen)
    for group in (plain, nucleus):
        if not group:
            continue
        index = torch.tensor(group, device=device)
        temperature = torch.tensor([temperatures[row] for row in group], device=device)
        scaled = logits[index] / temperature.unsqueeze(1)
        uniform = torch.tensor([uniforms[row] for row in group], dtype=torch.float64).to(device)
        if group is nucleus:
            top_p = torch.tensor([top_ps[row] for row in group], device=device)
            parts = _nucleus(scaled, top_p)
        else:
            parts = [(torch.arange(len(group), device=device), scaled, None)]
        for members, values, order in parts:
            choice, choice_logprobs = _inverse_transform(values, uniform[members])
            chosen = choice if order is None else order.gather(1, choice[:, None]).squeeze(1)
            rows = index[members]
            if raw_logprobs:
                choice_logprobs = _token_logprobs(logits[rows], chosen)
            tokens[rows], logprobs[rows] = chosen, choice_logprobs
    return tokens, logprobs


def _nucleus(scaled: Any, top_p: Any) -> list[tuple[Any, Any, Any]]:
    """The top-p nucleus of each row, as ``(rows, values, token ids)`` groups: the most likely
    tokens, most likely first, values outside the nucleus set to ``-inf``. Only the top ``k``
    tokens are ranked (a full sort of a 50k vocabulary costs several milliseconds per row),
    ``k`` growing by steps until a row's nucleus closes inside them; a row's ``k`` depends on
    the row alone, so its sample does not depend on the other rows."""
    import torch

    vocab = scaled.shape[-1]
    log_norm = torch.logsumexp(scaled, -1, keepdim=True)
    rows = torch.arange(scaled.shape[0], device=scaled.device)
    groups = []
    k = min(vocab, 64)
    while rows.numel():
        values, order = scaled[rows].topk(k, -1)
        probs = (values - log_norm[rows]).exp()
        mass = probs.cumsum(-1)
        # the tokens past the k-th are outside once the top k hold top_p of the mass
        closed = (mass[:, -1] >= top_p[rows]) | (k == vocab)
        outside = (mass - probs) >= top_p[rows].unsqueeze(1)
        values = values.masked_fill(outside, float("-inf"))
        groups.append((rows[closed], values[closed], order[closed]))
        rows = rows[~closed]
        k = min(vocab, k * 8)
    return groups


def _inverse_transform(values: Any, uniform: Any) -> tuple[Any, Any]:
    """Per row, the index where the cumulative softmax of ``values`` first exceeds
    ``uniform`` (float64 cumulative sums), and its log-probability."""
    import torch

    probs = torch.softmax(values, -1)
    cdf = probs.double().cumsum(-1)
    choice = torch.searchsorted(cdf, uniform.unsqueeze(1) * cdf[:, -1:], right=True)
    choice = choice.clamp_(max=values.shape[-1] - 1)
    # rounding at the very top of the cumulative sum must not pick a token of probability 0
    chosen_probs = probs.gather(1, choice)
    if not bool((chosen_probs > 0).all()):
        choice = torch.where(chosen_probs > 0, choice, probs.argmax(-1, keepdim=True))
        chosen_probs = probs.gather(1, choice)
    return choice.squeeze(1), chosen_probs.log().squeeze(1)


def _token_logprobs(logits: Any, tokens: Any) -> Any:
    """Log-softmax of ``logits`` at ``tokens``, one per row, without a full log-softmax."""
    import torch

    return logits.gather(1, tokens[:, None]).squeeze(1) - torch.logsumexp(logits, -1)
