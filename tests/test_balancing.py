"""Loss-balancing strategies (lesson 05) against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from codex_lab.training.balancing import (
    STRATEGIES,
    ConvergenceBalancer,
    DynamicWeightAverage,
    coba_weights,
    make_balancer,
    relative_improvement,
    slopes,
    spread,
    task_stats,
    token_losses,
)

# Three rows: task 0 (3 valid tokens), task 1 (1 valid token), task 0 (2 valid tokens).
LOSS = torch.tensor([[1.0, 2.0, 3.0, 9.0], [4.0, 9.0, 9.0, 9.0], [2.0, 2.0, 9.0, 9.0]])
TARGETS = torch.tensor([[5, 5, 5, -100], [5, -100, -100, -100], [5, 5, -100, -100]])
TASK = torch.tensor([0, 1, 0])
# by hand: task 0 mean = (1+2+3+2+2)/5 = 2, task 1 mean = 4; the 9s are masked out
EXACT = 1e-6  # float32 sums of a handful of small integers are exact to ~1e-7


def run(name: str, **kw) -> tuple[float, torch.Tensor]:
    loss, w = make_balancer(name, 2, **kw)(LOSS, TARGETS, TASK)
    return float(loss.detach()), w


def test_task_stats():
    s = task_stats(LOSS, TARGETS, TASK, 3)
    assert s.mean.tolist() == [2.0, 4.0, 0.0] and s.tokens.tolist() == [5.0, 1.0, 0.0]
    assert s.samples.tolist() == [2.0, 1.0, 0.0] and s.present.tolist() == [True, True, False]


@pytest.mark.parametrize(
    "name, loss, weights",
    [
        ("token", 14 / 6, [5 / 6, 1 / 6]),  # pooled: (1+2+3+4+2+2) / 6 tokens
        ("sample", (2 + 4 + 2) / 3, [2 / 3, 1 / 3]),  # mean of row means (6/3, 4/1, 4/2)
        ("task_token", (2 + 4) / 2, [0.5, 0.5]),  # MFTCoder case3: mean of task means
        ("uncertainty", 0.5 * (2 + 4), [0.5, 0.5]),  # s_k = 0: sum_k (L_k + 0) / 2
        ("coba", 3.0, [0.5, 0.5]),  # no validation history yet: equal weights
        ("dwa", 3.0, [0.5, 0.5]),  # no loss history yet: equal weights
    ],
)
def test_strategies_by_hand(name, loss, weights):
    got, w = run(name)
    assert abs(got - loss) < EXACT, (name, got, loss)
    assert torch.allclose(w, torch.tensor(weights), atol=EXACT)


def test_focal_downweights_the_easy_task():
    got, w = run("focal", gamma=2.0)
    a, b = (1 - math.exp(-2)) ** 2, (1 - math.exp(-4)) ** 2  # w_k ∝ (1 - e^{-L_k})^gamma
    assert torch.allclose(w, torch.tensor([a, b]) / (a + b), atol=EXACT)
    assert abs(got - (a * 2 + b * 4) / (a + b)) < EXACT
    assert w[0] < w[1]  # task 0 has the lower loss: it is "easy"


def test_absent_task_gets_zero_weight_and_masked_tokens_do_not_count():
    bal = make_balancer("task_token", 3)
    loss, w = bal(LOSS, TARGETS, TASK)
    assert w.tolist() == [0.5, 0.5, 0.0] and abs(float(loss) - 3.0) < EXACT
    changed = LOSS.clone()
    changed[TARGETS == -100] = 1e6  # masked positions may hold anything
    assert abs(float(bal(changed, TARGETS, TASK)[0]) - 3.0) < EXACT


def test_token_losses_match_cross_entropy():
    torch.manual_seed(0)
    logits, y = torch.randn(2, 5, 7), torch.randint(0, 7, (2, 5))
    y[0, :2] = -100
    tl = token_losses(logits, y)
    ref = torch.nn.functional.cross_entropy(logits.view(-1, 7), y.view(-1), ignore_index=-100)
    assert (tl[0, :2] == 0).all()
    assert abs(float(tl.sum() / (y != -100).sum()) - float(ref)) < EXACT  # pooled token mean == model loss


def test_dwa_raises_the_weight_of_the_slow_task():
    bal = DynamicWeightAverage(2, temperature=1.0, lag=2, ema=0.0)  # ema 0: the raw batch losses
    targets = torch.zeros(2, 1, dtype=torch.long)
    task = torch.tensor([0, 1])
    hist = [(4.0, 4.0), (2.0, 3.8), (1.0, 3.6)]  # task 0 halves, task 1 barely moves
    for a, b in hist:
        bal(torch.tensor([[a], [b]]), targets, task)
    _, w = bal(torch.tensor([[1.0], [3.6]]), targets, task)
    r = torch.tensor([1.0 / 4.0, 3.6 / 4.0])  # r_k = L_k(t-1) / L_k(t-1-lag)
    assert torch.allclose(w, torch.softmax(r, 0), atol=EXACT)
    assert w[1] > w[0]


def test_slopes_and_coba_weights():
    h = torch.tensor([[1.0, 1.0, 1.0], [0.8, 0.98, 1.02], [0.6, 0.96, 1.04]])  # (W=3, K=3)
    a = slopes(h)
    assert torch.allclose(a, torch.tensor([-0.2, -0.02, 0.02]), atol=EXACT)
    w = coba_weights(a, floor=0.05)
    assert abs(float(w.sum()) - 1.0) < EXACT and (w >= 0.05 - EXACT).all()
    assert abs(float(w[2]) - 0.05) < EXACT  # diverging task (val loss rising): floor only
    assert w[1] > w[0]  # the slow task gets more weight than the fast one
    # by hand: RCS over the two converging tasks = softmax(3 * alpha / sum|alpha|)
    s = 0.2 + 0.02 + 0.02
    e = torch.softmax(torch.tensor([3 * -0.2 / s, 3 * -0.02 / s]), 0)
    assert torch.allclose(w[:2], 0.05 + 0.85 * e, atol=EXACT)


def test_coba_follows_validation_history():
    bal = ConvergenceBalancer(2, window=3, floor=0.1)
    for v in ([4.0, 4.0], [3.0, 3.9], [2.0, 3.8]):
        bal.observe_val(torch.tensor(v))
    _, w = bal(LOSS, TARGETS, TASK)
    assert w[1] > w[0] and abs(float(w.sum()) - 1) < EXACT
    with pytest.raises(ValueError, match="window"):
        ConvergenceBalancer(2, window=1)
    with pytest.raises(ValueError, match="floor"):
        ConvergenceBalancer(4, floor=0.3)


def test_uncertainty_learns_its_log_variances():
    bal = make_balancer("uncertainty", 2)
    loss, _ = bal(LOSS, TARGETS, TASK)
    loss.backward()
    # d/ds_k of (exp(-s_k) L_k + s_k) / 2 at s = 0 is (1 - L_k) / 2
    assert torch.allclose(bal.log_var.grad, torch.tensor([(1 - 2) / 2, (1 - 4) / 2]), atol=EXACT)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown balancing strategy"):
        make_balancer("magic", 2)
    with pytest.raises(ValueError, match="same shape"):
        make_balancer("token", 2)(LOSS, TARGETS[:, :2], TASK)
    with pytest.raises(ValueError, match="task indices"):
        make_balancer("token", 2)(LOSS, TARGETS, torch.tensor([0, 2, 0]))
    with pytest.raises(ValueError, match="no valid"):
        make_balancer("task_token", 2)(LOSS, torch.full_like(TARGETS, -100), TASK)
    assert set(STRATEGIES) == {"sample", "token", "task_token", "focal", "dwa", "uncertainty", "coba"}


def test_relative_improvement_and_spread():
    r = relative_improvement(torch.tensor([2.0, 4.0]), torch.tensor([1.0, 3.0]))
    assert torch.allclose(r, torch.tensor([0.5, 0.25])) and abs(spread(r) - 0.25) < EXACT
