"""Real-time chunking by guidance: the flow integrated here, steered by a vector-Jacobian product.

A release whose contract has ``[rtc]`` exports a graph that inpaints without gradients
(docs/contract.md). Where PyTorch can differentiate, the paper's stronger variant runs
instead (K. Black, M. Y. Galliker, S. Levine, "Real-Time Execution of Action Chunking Flow
Policies", 2025, arXiv 2506.07339, ΠGDM-style guided inpainting): the release ships the
flow-matching head as two more ``torch.export`` programs, named by the backend options

* ``rtc_encoder``: the observation inputs (the contract's inputs but the noise and the
  ``[rtc]`` ones, in contract order) -> a tuple of context tensors;
* ``rtc_velocity``: ``(*context, x [B, H, S], t [B])`` -> the velocity ``[B, H, S]``,

and this module integrates ``[noise] denoising_steps`` Euler steps from the noise
(``t = 0``) to the chunk (``t = 1``). The flow state ``x`` has the noise's shape
(``[noise] shape``, ``[H, S]``): the action chunk itself (``S`` = ``[action] dim``, the demo)
or wider (SmolVLA's ``max_action_dim``), the action then being its first ``[action] dim``
columns and the other columns free (their guide weight is zero; the gradient still moves
them where the action depends on them). At each step, with ``Y`` the waypoints to continue
and ``W`` their weights (the ``[rtc]`` inputs, zero-padded to the state's width):

    Â¹ = x + (1 - t) v(x, t)                 the chunk the step predicts
    g  = (W ⊙ (Y - Â¹))ᵀ ∂Â¹/∂x               one vector-Jacobian product through the head
    v' = v + min(β, (1 - t) / (t r²)) g,  r² = (1 - t)² / (t² + (1 - t)²)
    x  = x + v' / n

``β`` is ``rtc_guidance`` (the paper's 5). With every weight zero no gradient is taken: the
plain chunk, the same computation as the exported graph's. The time runs from the noise
(0) to the chunk (1) whatever the policy's own convention: a policy whose time runs the
other way (LeRobot's SmolVLA) exports ``-v(x, 1 - t)`` as its velocity. Loaded only through
:func:`torch.export.load` (no pickled code), like the main program.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vlad.contract import Contract
from vlad.errors import BackendError


class GuidedFlow:
    """A callable taking the contract's inputs in ``input_order`` and returning the chunk."""

    def __init__(
        self,
        contract: Contract,
        input_order: Sequence[str],
        encoder: Callable[..., Any],
        velocity: Callable[..., Any],
        guidance: float,
    ) -> None:
        if contract.rtc is None or contract.noise is None:
            raise BackendError("torch: rtc_encoder / rtc_velocity need a contract with [rtc] and [noise]")
        self.rtc = contract.rtc
        self.noise = contract.noise.input
        self.steps = contract.noise.denoising_steps
        state = tuple(contract.noise.shape)
        adim = contract.action.dim
        if len(state) != 2 or state[0] != contract.action.chunk_length or state[1] < adim:
            raise BackendError(
                f"torch: guidance integrates a flow state of [noise] shape [chunk_length, >= action dim] = "
                f"[{contract.action.chunk_length}, >= {adim}]; the contract's is {list(state)}"
            )
        # A state wider than the action: the action is its first columns (None: as wide).
        self.action_dim = adim if state[1] > adim else None
        skip = {self.noise, self.rtc.actions_input, self.rtc.weights_input}
        self.observation = [spec.name for spec in contract.inputs if spec.name not in skip]
        self.order = list(input_order)
        self.encoder = encoder
        self.velocity = velocity
        self.guidance = guidance

    def __call__(self, *inputs: Any) -> Any:
        import torch

        named = dict(zip(self.order, inputs, strict=True))
        # Out of inference mode: the velocity's backward keeps the context for the product.
        with torch.inference_mode(False):
            named = {k: v.clone() if v.is_inference() else v for k, v in named.items()}
            with torch.no_grad():
                context = self.encoder(*(named[n] for n in self.observation))
            context = context if isinstance(context, (tuple, list)) else (context,)
            x = named[self.noise]
            target = named[self.rtc.actions_input]
            weights = named[self.rtc.weights_input][..., None]
            guided = bool((weights > 0).any())
            if self.action_dim is not None:  # guide the action's columns only
                free = x.shape[-1] - self.action_dim
                target = torch.nn.functional.pad(target, (0, free))
                weights = torch.nn.functional.pad(weights.expand(*target.shape[:-1], self.action_dim), (0, free))
            n = self.steps
            batch = x.shape[0]
            for k in range(n):
                tau = k / n
                t = torch.full((batch,), tau, dtype=x.dtype, device=x.device)
                if guided:
                    with torch.enable_grad():
                        xg = x.detach().requires_grad_(True)
                        v = self.velocity(*context, xg, t)
                        predicted = xg + (1.0 - tau) * v
                        (grad,) = torch.autograd.grad(predicted, xg, weights * (target - predicted))
                    r2 = (1.0 - tau) ** 2 / (tau**2 + (1.0 - tau) ** 2)
                    scale = self.guidance if tau == 0.0 else min(self.guidance, (1.0 - tau) / (tau * r2))
                    v = v.detach() + scale * grad
                else:
                    with torch.no_grad():
                        v = self.velocity(*context, x, t)
                x = (x + v / n).detach()
            return x if self.action_dim is None else x[..., : self.action_dim]
