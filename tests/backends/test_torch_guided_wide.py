"""``vlad_torch.guided`` with a flow state wider than the action (SmolVLA's ``max_action_dim``
columns): the action is the state's first ``[action] dim`` columns, the guide weighs only
those, the chunk returned is those. A toy flow head (plain functions) on the demo contract
with a 4-column noise, so each property is computed exactly; the demo's own guided release
(its state as wide as the action) is tested in test_torch.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vlad.errors import BackendError

torch = pytest.importorskip("torch")

from vlad_torch.guided import GuidedFlow  # noqa: E402

H, ADIM, WIDTH = 50, 2, 4


def _wide(contract, width: int = WIDTH):
    assert contract.noise is not None and contract.action.dim == ADIM
    return dataclasses.replace(contract, noise=dataclasses.replace(contract.noise, shape=(H, width)))


def _flow(contract, coupled: bool) -> GuidedFlow:
    """Velocity towards a fixed chunk ``c`` (the encoder's context), each column on its own,
    or (``coupled``) the action's columns also driven by the sum of the padded ones."""
    action_columns = (torch.arange(WIDTH) < ADIM).float()

    def encoder(*observation):
        return (observation[-1].sum() * 0.0 + torch.linspace(-1.0, 1.0, H * WIDTH).reshape(1, H, WIDTH),)

    def velocity(c, x, t):
        v = c - x
        if coupled:
            v = v + 0.5 * x[..., ADIM:].sum(-1, keepdim=True) * action_columns
        return v

    return GuidedFlow(contract, [s.name for s in contract.inputs], encoder, velocity, 5.0)


def _inputs(contract, weights: np.ndarray) -> list:
    gen = np.random.default_rng(3)
    feed = {}
    for spec in contract.inputs:
        shape = list(spec.shape)
        if spec.name == contract.noise.input:
            shape[-1] = WIDTH
        feed[spec.name] = torch.from_numpy(gen.standard_normal(shape).astype(np.float32)).to(
            torch.int64 if spec.dtype == "int64" else torch.float32
        )
    feed[contract.rtc.actions_input] = torch.full((1, H, ADIM), 3.0)
    feed[contract.rtc.weights_input] = torch.from_numpy(weights[None])
    return [feed[s.name] for s in contract.inputs]


def _states(flow: GuidedFlow, inputs: list) -> tuple[list, torch.Tensor]:
    """The flow's output and the state it integrated, before each step."""
    seen, inner = [], flow.velocity

    def spy(c, x, t):
        seen.append(x.detach().clone())
        return inner(c, x, t)

    flow.velocity = spy
    try:
        return seen, flow(*inputs)
    finally:
        flow.velocity = inner


def test_a_wider_state_gives_the_actions_columns_and_zero_weights_the_plain_chunk(contract):
    wide = _wide(contract)
    flow = _flow(wide, coupled=True)
    inputs = _inputs(wide, np.zeros(H, np.float32))
    out = flow(*inputs)
    assert tuple(out.shape) == (1, H, ADIM)
    named = dict(zip(flow.order, inputs, strict=True))
    (c,) = flow.encoder(*(named[n] for n in flow.observation))
    x, n = named[wide.noise.input], wide.noise.denoising_steps
    for k in range(n):  # Euler over the whole state, by hand
        x = x + flow.velocity(c, x, torch.full((1,), k / n)) / n
    assert torch.equal(out, x[..., :ADIM])


def test_guidance_weighs_the_actions_columns_only(contract):
    """Columns on their own: the padded columns integrate exactly as without a guide (their
    weight is zero, nothing couples them) and so do the unweighted waypoints; the weighted
    ones come closer to the target (3.0). Coupled: the guide reaches the padded columns
    through the velocity's dependence on them (the gradient is of the whole state)."""
    wide = _wide(contract)
    weights = np.zeros(H, np.float32)
    weights[:10] = 1.0
    zero = _inputs(wide, np.zeros(H, np.float32))
    guide = _inputs(wide, weights)
    plain_states, plain = _states(_flow(wide, coupled=False), zero)
    states, out = _states(_flow(wide, coupled=False), guide)
    assert len(states) == wide.noise.denoising_steps > 1
    for a, b in zip(plain_states, states, strict=True):
        assert torch.equal(a[..., ADIM:], b[..., ADIM:])
    assert torch.equal(out[:, 10:], plain[:, 10:])
    assert float((out[:, :10] - 3.0).abs().mean()) < 0.5 * float((plain[:, :10] - 3.0).abs().mean())

    plain_states, _ = _states(_flow(wide, coupled=True), zero)
    states, _ = _states(_flow(wide, coupled=True), guide)
    assert not torch.equal(plain_states[-1][:, :10, ADIM:], states[-1][:, :10, ADIM:])


def test_a_state_narrower_than_the_action_is_refused(contract):
    with pytest.raises(BackendError, match=r"flow state of \[noise\] shape \[chunk_length, >= action dim\]"):
        _flow(_wide(contract, width=1), coupled=False)
