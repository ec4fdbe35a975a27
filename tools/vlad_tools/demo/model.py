"""A small pi0-shaped Vision-Language-Action policy (PyTorch), trained for the demo release.

Shape of pi0 (Black et al., 2024), scaled down to train in minutes on two CPU cores:

    camera image --conv encoder--> 64 image tokens ┐
    instruction  --embedding-----> 8 language tokens ├─ transformer trunk ─> prefix
    proprio      --linear--------> 1 state token    ┘                         │ (K/V computed once)
    noise x_0 --[ action expert: self-attn + cross-attn to prefix ] x K Euler steps --> action chunk H x D

The action expert is a flow-matching head: it predicts the velocity ``v = a - x_0`` of the
straight path ``x_t = (1 - t) x_0 + t a`` and integrates it from ``t = 0`` (noise) to
``t = 1`` in ``steps`` Euler steps. The initial noise is an explicit model input, so every
backend can be compared on exactly the same computation.

Attention is written with plain matmul/softmax so that ``torch.export`` and the ONNX
exporter see only operators every runtime supports.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ModelConfig:
    image_size: int = 64
    vocab_size: int = 32
    max_tokens: int = 8
    proprio_dim: int = 4
    horizon: int = 50
    action_dim: int = 2
    d_model: int = 64
    heads: int = 4
    trunk_layers: int = 2
    expert_layers: int = 2
    steps: int = 10

    def to_dict(self) -> dict:
        return asdict(self)


class Attention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def keys_values(self, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, n, d = ctx.shape
        kv = self.kv(ctx).reshape(b, n, 2, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        return kv[0], kv[1]

    def attend(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q = self.q(x).reshape(b, n, self.heads, d // self.heads).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-1, -2) * (1.0 / math.sqrt(d // self.heads)), dim=-1)
        return self.out((w @ v).transpose(1, 2).reshape(b, n, d))

    def forward(self, x: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        k, v = self.keys_values(ctx)
        return self.attend(x, k, v)


def _mlp(d: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))


class TrunkBlock(nn.Module):
    """Pre-norm transformer block over the prefix (image, language, state tokens)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.mlp = _mlp(d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.n1(x)
        x = x + self.attn(h, h)
        return x + self.mlp(self.n2(x))


class ExpertBlock(nn.Module):
    """Action-expert block: self-attention over the chunk, cross-attention to the prefix."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.n1, self.n2, self.n3, self.nc = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn = Attention(d, heads)
        self.cross = Attention(d, heads)
        self.mlp = _mlp(d)

    def prefix_kv(self, prefix: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cross.keys_values(self.nc(prefix))

    def forward(self, x: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h = self.n1(x)
        x = x + self.self_attn(h, h)
        x = x + self.cross.attend(self.n2(x), k, v)
        return x + self.mlp(self.n3(x))


class ImageEncoder(nn.Module):
    """Conv encoder -> 8x8 grid of tokens. Two coordinate channels (CoordConv) make target
    positions easy to read off, which a tiny network otherwise learns slowly."""

    coords: torch.Tensor  # a (non-persistent) buffer

    def __init__(self, d: int, size: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(5, 16, 4, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.GELU(),
            nn.Conv2d(32, d, 3, stride=2, padding=1),
        )  # fmt: skip
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, size), torch.linspace(-1, 1, size), indexing="ij")
        self.register_buffer("coords", torch.stack([ys, xs])[None], persistent=False)
        grid = size // 8
        self.pos = nn.Parameter(torch.randn(1, grid * grid, d) * 0.02)

    def forward(self, img: torch.Tensor) -> torch.Tensor:
        x = torch.cat([img, self.coords.expand(img.shape[0], -1, -1, -1)], dim=1)
        x = self.net(x)
        return x.flatten(2).transpose(1, 2) + self.pos


def time_embedding(t: torch.Tensor, d: int) -> torch.Tensor:
    """Sinusoidal embedding of the flow time ``t`` in [0, 1], shape [B] -> [B, d]."""
    half = d // 2
    freqs = torch.exp(torch.arange(half, dtype=torch.float32, device=t.device) * (-math.log(1000.0) / half))
    ang = t[:, None] * 1000.0 * freqs[None]
    return torch.cat([torch.sin(ang), torch.cos(ang)], dim=-1)


class TinyPi0(nn.Module):
    """The demo VLA. ``forward`` is the exported inference graph: inputs as in the contract."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.image = ImageEncoder(d, cfg.image_size)
        self.token_emb = nn.Embedding(cfg.vocab_size, d)
        self.token_pos = nn.Parameter(torch.randn(1, cfg.max_tokens, d) * 0.02)
        self.state = nn.Linear(cfg.proprio_dim, d)
        self.type_emb = nn.Parameter(torch.randn(3, d) * 0.02)  # image / language / state
        self.trunk = nn.ModuleList(TrunkBlock(d, cfg.heads) for _ in range(cfg.trunk_layers))
        self.trunk_norm = nn.LayerNorm(d)
        self.act_in = nn.Linear(cfg.action_dim, d)
        self.act_pos = nn.Parameter(torch.randn(1, cfg.horizon, d) * 0.02)
        self.time_mlp = nn.Sequential(nn.Linear(d, d), nn.GELU(), nn.Linear(d, d))
        # Global conditioning of the action expert on the instruction (pooled language
        # tokens of the trunk output): the two demo goals are mirror images that differ
        # only in the instruction, and attention alone picks that up slowly.
        self.lang_cond = nn.Linear(d, d)
        self.expert = nn.ModuleList(ExpertBlock(d, cfg.heads) for _ in range(cfg.expert_layers))
        self.act_out = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, cfg.action_dim))

    def prefix(
        self, image: torch.Tensor, tokens: torch.Tensor, proprio: torch.Tensor, *_: torch.Tensor
    ) -> torch.Tensor:
        """The trunk's output over the observation tokens (the rest of ``forward``'s inputs,
        noise and the real-time chunking guide, do not enter it)."""
        img = self.image(image) + self.type_emb[0]
        lang = self.token_emb(tokens) + self.token_pos + self.type_emb[1]
        state = self.state(proprio)[:, None] + self.type_emb[2]
        x = torch.cat([img, lang, state], dim=1)
        for block in self.trunk:
            x = block(x)
        return self.trunk_norm(x)

    def prefix_kv(self, prefix: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return [cast(ExpertBlock, block).prefix_kv(prefix) for block in self.expert]

    def condition(self, prefix: torch.Tensor) -> torch.Tensor:
        """Pooled instruction embedding from the trunk output, [B, d]."""
        n_img = (self.cfg.image_size // 8) ** 2
        return self.lang_cond(prefix[:, n_img : n_img + self.cfg.max_tokens].mean(dim=1))

    def velocity(
        self, kv: list[tuple[torch.Tensor, torch.Tensor]], cond: torch.Tensor, x: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        h = self.act_in(x) + self.act_pos + (self.time_mlp(time_embedding(t, self.cfg.d_model)) + cond)[:, None]
        for block, (k, v) in zip(self.expert, kv, strict=True):
            h = block(h, k, v)
        return self.act_out(h)

    def forward(
        self,
        image_overhead: torch.Tensor,
        tokens: torch.Tensor,
        proprio: torch.Tensor,
        noise: torch.Tensor,
        rtc_actions: torch.Tensor | None = None,
        rtc_weights: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The action chunk for one observation, integrated from ``noise``.

        ``rtc_actions`` / ``rtc_weights`` (``[B, H, D]`` normalized like the output, ``[B, H]``
        in [0, 1]) are real-time chunking by inpainting, without gradients (Black et al. 2025,
        arXiv 2506.07339, the variant for graphs that cannot differentiate): before every
        Euler step the chunk is pulled towards the straight path from the noise to
        ``rtc_actions``, and after the last one towards ``rtc_actions`` itself, each pull by the
        share of the waypoint's weight that makes the pulls together amount to it: a weight of
        1 reproduces the given waypoint, 0.5 ends half way, 0 leaves the policy free. All-zero
        weights compute exactly what the plain policy computes (``x + 0 * (...)`` is ``x``).
        """
        prefix = self.prefix(image_overhead, tokens, proprio)
        kv, cond = self.prefix_kv(prefix), self.condition(prefix)
        x = noise
        dt = 1.0 / self.cfg.steps
        w = None
        if rtc_weights is not None:
            # Each of the steps + 1 pulls takes this share, so that together they pull a waypoint
            # of weight w by w (weight 1: all the way at every pull; 0: never).
            w = (1.0 - (1.0 - rtc_weights.clamp(0.0, 1.0)) ** (1.0 / (self.cfg.steps + 1)))[:, :, None]
        for k in range(self.cfg.steps):
            tk = k * dt
            if w is not None and rtc_actions is not None:
                x = x + w * ((1.0 - tk) * noise + tk * rtc_actions - x)
            # (x[:, 0, 0] * 0 + k * dt) gives t the batch size symbolically (dynamic batch).
            t = x[:, 0, 0] * 0.0 + tk
            x = x + dt * self.velocity(kv, cond, x, t)
        if w is not None and rtc_actions is not None:
            x = x + w * (rtc_actions - x)
        return x

    def flow_loss(
        self, image: torch.Tensor, tokens: torch.Tensor, proprio: torch.Tensor, actions: torch.Tensor
    ) -> torch.Tensor:
        """Flow-matching training loss on normalized action chunks ``[B, H, D]``."""
        b = actions.shape[0]
        noise = torch.randn_like(actions)
        # pi0 samples t from a Beta distribution leaning towards the noisy end (t = 0 here),
        # where the velocity field is hardest to learn.
        t = (1.0 - torch.distributions.Beta(1.5, 1.0).sample((b,)).to(actions)) * 0.999
        x_t = (1 - t[:, None, None]) * noise + t[:, None, None] * actions
        prefix = self.prefix(image, tokens, proprio)
        v = self.velocity(self.prefix_kv(prefix), self.condition(prefix), x_t, t)
        return F.mse_loss(v, actions - noise)


class FlowEncoder(nn.Module):
    """The flow head's context from the observation (real-time chunking by guidance,
    ``vlad_torch.guided``): the expert's keys/values per layer and the instruction condition."""

    def __init__(self, model: TinyPi0) -> None:
        super().__init__()
        self.model = model

    def forward(self, image: torch.Tensor, tokens: torch.Tensor, proprio: torch.Tensor) -> tuple[torch.Tensor, ...]:
        prefix = self.model.prefix(image, tokens, proprio)
        kv = self.model.prefix_kv(prefix)
        return (*[t for pair in kv for t in pair], self.model.condition(prefix))


class FlowVelocity(nn.Module):
    """The flow head's velocity at ``(x, t)`` given :class:`FlowEncoder`'s context."""

    def __init__(self, model: TinyPi0) -> None:
        super().__init__()
        self.model = model

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        *context, x, t = args
        *kv, cond = context
        pairs = [(kv[i], kv[i + 1]) for i in range(0, len(kv), 2)]
        return self.model.velocity(pairs, cond, x, t)
