"""A π0-architecture VLA (PyTorch) built from the planner's model description, random weights.

The shapes come from one place, the planner's model file (``tools/vlad_tools/planner/data/models/
pi0.toml``, parsed by :mod:`vlad_tools.planner.spec`): what the planner predicts is what runs.

    3 cameras --SigLIP-shaped ViT (patch conv, LayerNorm blocks)--> 3 x 256 tokens --projector--┐
    language tokens --embedding (x sqrt(width))--------------------------------> 32 tokens ──┤
                 Gemma-shaped prefill (RMSNorm, RoPE, grouped-query attention, gated FFN) <──┘
                    │ every layer's K/V of the 800 prefix tokens (the KV cache)
    noise x_1, state --[ expert: the chunk's 50 tokens attend the prefix KV cache and
                         each other ] x 10 Euler steps (t = 1 -> 0) --> 50 x 14 action chunk

As in π0 (Black et al. 2024; openpi's ``pi0.py``): the image tokens are projected to the
backbone's width; the prefix attends bidirectionally, padded language tokens masked out;
the action expert is a second, narrower transformer whose layer ``i`` attends the keys and
values of backbone layer ``i`` (its K/V heads and head size equal the backbone's) plus its
own; actions and flow time are mixed by a two-layer MLP; the flow runs from noise at
``t = 1`` to actions at ``t = 0``. Where the planner's description is silent the choice
here is stated: the state is projected and added to every action token (the planner
counts ``chunk`` action tokens, π0 adds one state token); positions run 0..799 over the
prefix (π0 skips padding); the expert projects Q/K/V once per layer (the description's
``qkv_passes = 2`` reproduces source A's operator count, not the architecture).

Weights are random, drawn per parameter from a generator seeded by ``(seed, parameter
name)`` (:func:`init_tensor`), so a model rebuilt anywhere from the same description and
seed has the same weights, and an exporter can produce them one tensor at a time
(:mod:`vlad_tools.pi0.export`) instead of holding all of them.

Inputs and outputs are float32 whatever the weights' dtype: a bf16 release and an fp32
release have the same contract.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import nn
from torch.nn import functional as F

from vlad_tools.planner.spec import PlannerError, Transformer, VLAModel

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# π0's time embedding (openpi pi0.py: create_sinusoidal_pos_embedding(min=4e-3, max=4.0)).
TIME_MIN_PERIOD, TIME_MAX_PERIOD = 4e-3, 4.0
ROPE_BASE = 10_000.0
# The exported graph's camera inputs (π0's ALOHA views); torch.export names a program's
# inputs after ``forward``'s arguments, and the contract names the same.
CAMERA_INPUTS = ("image_base", "image_left_wrist", "image_right_wrist")


@dataclass(frozen=True)
class Pi0Shape:
    """The planner's description plus what it does not say: the state's size, the
    embedding table's rows and the language padding id."""

    spec: VLAModel
    state_dim: int
    vocab: int
    pad_id: int = 0

    @property
    def patch(self) -> int:
        v = self.spec.vision
        return v.image_height // math.isqrt(v.tokens_per_image)


def check_shape(shape: Pi0Shape) -> None:
    """Refuse a description this module cannot build, with the reason (one line)."""
    s = shape.spec
    v, b, a = s.vision, s.backbone.transformer, s.action.transformer
    problems = []
    if v.kind != "vit" or v.transformer is None:
        problems.append("the vision encoder must be a ViT (vision.kind = 'vit')")
    side = math.isqrt(v.tokens_per_image)
    if side * side != v.tokens_per_image or v.image_height != v.image_width or v.image_height % side:
        problems.append(
            f"vision: {v.tokens_per_image} tokens must be a square grid of patches over a square image "
            f"({v.image_height} x {v.image_width})"
        )
    if s.action.kind != "flow" or a is None or s.action.context != "kv_cache":
        problems.append("the action head must be a flow expert attending the prefix KV cache")
    elif (a.kv_heads, a.head_dim) != (b.kv_heads, b.head_dim):
        problems.append(
            f"the expert's K/V heads x head size ({a.kv_heads} x {a.head_dim}) must equal the backbone's "
            f"({b.kv_heads} x {b.head_dim}): it attends the backbone's KV cache"
        )
    if v.cameras != len(CAMERA_INPUTS):
        problems.append(f"{v.cameras} cameras: the graph takes {len(CAMERA_INPUTS)} ({', '.join(CAMERA_INPUTS)})")
    for t, where in ((v.transformer, "vision"), (b, "backbone"), (a, "action")):
        if t is not None and t.heads % t.kv_heads:
            problems.append(f"{where}: heads ({t.heads}) must be a multiple of kv_heads ({t.kv_heads})")
    if problems:
        raise PlannerError(f"cannot build {s.name}: " + "; ".join(problems))


# ---- sizes: the full description, or a smaller one ---------------------------------------


def _resize(t: Transformer, width: float, layers: int | None) -> Transformer:
    heads = max(1, round(t.heads * width))
    kv = max(1, min(heads, round(t.kv_heads * width)))
    while heads % kv:
        kv -= 1
    return dataclasses.replace(
        t,
        layers=layers or t.layers,
        hidden=max(8, round(t.hidden * width)),
        ffn=max(8, round(t.ffn * width)),
        heads=heads,
        kv_heads=kv,
    )


def scaled(
    spec: VLAModel,
    width: float = 1.0,
    *,
    vision_layers: int | None = None,
    backbone_layers: int | None = None,
    action_layers: int | None = None,
) -> VLAModel:
    """``spec`` with every transformer's width (hidden, FFN, heads) times ``width`` and the
    given layer counts; token counts, chunk, steps and head sizes are kept, so a small
    model has the full one's inputs and outputs. ``width = 1`` without layer counts is
    ``spec`` itself. The expert's K/V heads follow the backbone's (it attends its cache)."""
    if width <= 0 or width > 1:
        raise PlannerError(f"width must be in (0, 1], got {width:g}")
    if width == 1 and not (vision_layers or backbone_layers or action_layers):
        return spec
    v, b, a = spec.vision, spec.backbone, spec.action
    assert v.transformer is not None and a.transformer is not None  # check_shape refuses others
    backbone_t = _resize(b.transformer, width, backbone_layers)
    action_t = _resize(a.transformer, width, action_layers)
    action_t = dataclasses.replace(action_t, kv_heads=backbone_t.kv_heads)
    if action_t.heads % action_t.kv_heads:
        action_t = dataclasses.replace(action_t, heads=action_t.kv_heads * max(1, action_t.heads // action_t.kv_heads))
    parts = [f"x{width:g}"] + [
        f"{n}{k}" for n, k in (("v", vision_layers), ("b", backbone_layers), ("a", action_layers)) if k
    ]
    return dataclasses.replace(
        spec,
        name=f"{spec.name}-{'-'.join(parts)}",
        vision=v.with_transformer(_resize(v.transformer, width, vision_layers)),
        backbone=b.with_transformer(backbone_t),
        action=dataclasses.replace(a.with_transformer(action_t), qkv_passes=1),
    )


# ---- deterministic random weights --------------------------------------------------------


def tensor_seed(seed: int, name: str) -> int:
    """The generator seed of parameter ``name`` (independent of construction order)."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest()[:8], "little") & (2**63 - 1)


def init_tensor(name: str, shape: Sequence[int], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """The value of parameter ``name``: norms' scales 1, biases 0, every other weight normal
    with std ``1 / sqrt(fan in)``, drawn in float32 and rounded to ``dtype`` (a bf16 model
    is its fp32 twin, rounded). Fan in: a dense ``[in, out]`` weight's first axis,
    an embedding's or a position table's width."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "bias":
        return torch.zeros(shape, dtype=dtype)
    if ".norm" in f".{name}":
        return torch.ones(shape, dtype=dtype)
    if leaf == "pos" or name.endswith("embed.weight"):
        fan_in = shape[-1]
    else:
        fan_in = shape[0]
    g = torch.Generator().manual_seed(tensor_seed(seed, name))
    out = torch.empty(shape, dtype=torch.float32).normal_(0.0, 1.0 / math.sqrt(fan_in), generator=g)
    return out.to(dtype)


# ---- building blocks ---------------------------------------------------------------------


class Dense(nn.Module):
    """``x @ weight + bias`` with ``weight`` stored ``[in, out]``: exported as a MatMul on the
    weight itself (``nn.Linear`` stores ``[out, in]``, and the ONNX exporter's optimizer
    then folds a transposed copy of every weight: twice the memory while exporting, and an
    initializer no longer named after its parameter)."""

    def __init__(self, d_in: int, d_out: int, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(d_out)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x @ self.weight
        return y if self.bias is None else y + self.bias


class RMSNorm(nn.Module):
    """Gemma's RMSNorm (computed in float32, scale ``1 + weight`` with weight 0 = identity
    in Gemma; here ``weight`` itself, initialised to 1)."""

    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (y * self.weight.float()).to(x.dtype)


def rope_tables(positions: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of rotary embeddings for positions ``0..positions-1``, ``[positions, head_dim]``."""
    inv = 1.0 / ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    ang = torch.arange(positions, dtype=torch.float32)[:, None] * inv[None]
    ang = torch.cat([ang, ang], dim=-1)
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, H, N, D]`` by the tables' rows for its N positions."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Scaled dot-product attention, ``q`` ``[B, H, N, D]``, ``k``/``v`` ``[B, KV, M, D]``
    (grouped: each K/V head serves ``H / KV`` query heads), ``bias`` additive ``[B, 1, 1, M]``."""
    b, h, n, d = q.shape
    kv = k.shape[1]
    if kv != h:
        k = k[:, :, None].expand(b, kv, h // kv, k.shape[2], d).reshape(b, h, k.shape[2], d)
        v = v[:, :, None].expand(b, kv, h // kv, v.shape[2], d).reshape(b, h, v.shape[2], d)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)


class FeedForward(nn.Module):
    """GELU (tanh) FFN, gated (Gemma: ``down(gelu(gate(x)) * up(x))``) or plain (SigLIP)."""

    def __init__(self, d: int, ffn: int, gated: bool, bias: bool) -> None:
        super().__init__()
        self.gate = Dense(d, ffn, bias=bias) if gated else None
        self.up = Dense(d, ffn, bias=bias)
        self.down = Dense(ffn, d, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.up(x)
        if self.gate is not None:
            h = F.gelu(self.gate(x), approximate="tanh") * h
        else:
            h = F.gelu(h, approximate="tanh")
        return self.down(h)


class VisionBlock(nn.Module):
    """SigLIP block: LayerNorm, multi-head attention with biases, LayerNorm, FFN."""

    def __init__(self, t: Transformer) -> None:
        super().__init__()
        self.heads, self.head_dim = t.heads, t.head_dim
        q = t.heads * t.head_dim
        self.norm1, self.norm2 = nn.LayerNorm(t.hidden), nn.LayerNorm(t.hidden)
        self.qkv = Dense(t.hidden, 3 * q)
        self.out = Dense(q, t.hidden)
        self.mlp = FeedForward(t.hidden, t.ffn, t.gated_ffn, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, _ = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        h = attend(qkv[0], qkv[1], qkv[2], None)
        x = x + self.out(h.transpose(1, 2).reshape(b, n, self.heads * self.head_dim))
        return x + self.mlp(self.norm2(x))


class Vision(nn.Module):
    """SigLIP-shaped encoder: patches, learned positions, blocks, final LayerNorm, and
    PaliGemma's projector to the backbone's width. Cameras run as one batch."""

    def __init__(self, shape: Pi0Shape) -> None:
        super().__init__()
        v = shape.spec.vision
        t = v.transformer
        assert t is not None  # check_shape
        self.patch_size = shape.patch
        # SigLIP's patch convolution (kernel = stride = patch) as a dense layer over the
        # flattened patches: the same product, and ONNX has no bf16 Conv before opset 22.
        self.patch = Dense(3 * shape.patch * shape.patch, t.hidden)
        self.pos = nn.Parameter(torch.zeros(1, v.tokens_per_image, t.hidden))
        self.blocks = nn.ModuleList(VisionBlock(t) for _ in range(t.layers))
        self.norm = nn.LayerNorm(t.hidden)
        self.projector = Dense(t.hidden, shape.spec.backbone.transformer.hidden)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """``[B * cameras, 3, H, W]`` -> ``[B * cameras, tokens, backbone width]``."""
        n, c, h, w = images.shape
        p = self.patch_size
        patches = images.reshape(n, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5).reshape(n, -1, c * p * p)
        x = self.patch(patches) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.projector(self.norm(x))


class DecoderBlock(nn.Module):
    """Gemma-shaped block: RMSNorm, RoPE grouped-query attention, RMSNorm, gated FFN.
    ``attend_prefix`` also takes another stack's K/V (the expert attending the cache)."""

    def __init__(self, t: Transformer) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = t.heads, t.kv_heads, t.head_dim
        self.norm1, self.norm2 = RMSNorm(t.hidden), RMSNorm(t.hidden)
        self.q = Dense(t.hidden, t.heads * t.head_dim, bias=False)
        self.k = Dense(t.hidden, t.kv_heads * t.head_dim, bias=False)
        self.v = Dense(t.hidden, t.kv_heads * t.head_dim, bias=False)
        self.o = Dense(t.heads * t.head_dim, t.hidden, bias=False)
        self.mlp = FeedForward(t.hidden, t.ffn, t.gated_ffn, bias=False)

    def project(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of ``x`` (RoPE applied), heads first."""
        b, n, _ = x.shape
        h = self.norm1(x)
        q = self.q(h).reshape(b, n, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).reshape(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).reshape(b, n, self.kv_heads, self.head_dim).transpose(1, 2)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def finish(self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias) -> torch.Tensor:
        b, n, _ = x.shape
        h = attend(q, k, v, bias).transpose(1, 2).reshape(b, n, self.heads * self.head_dim)
        x = x + self.o(h)
        return x + self.mlp(self.norm2(x))


class Backbone(nn.Module):
    """The prefill: token embedding, blocks; returns every layer's K/V of the prefix."""

    def __init__(self, shape: Pi0Shape) -> None:
        super().__init__()
        t = shape.spec.backbone.transformer
        self.width = t.hidden
        self.embed = nn.Embedding(shape.vocab, t.hidden)
        self.blocks = nn.ModuleList(DecoderBlock(t) for _ in range(t.layers))

    def forward(
        self, image_tokens: torch.Tensor, tokens: torch.Tensor, bias: torch.Tensor, cos, sin
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        lang = self.embed(tokens) * math.sqrt(self.width)
        x = torch.cat([image_tokens, lang.to(image_tokens.dtype)], dim=1)
        cache = []
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            q, k, v = cast(DecoderBlock, block).project(x, cos, sin)
            cache.append((k, v))
            if i < last:  # the last layer's output feeds nothing: only its K/V are used
                x = cast(DecoderBlock, block).finish(x, q, k, v, bias)
        return cache


class Expert(nn.Module):
    """The flow-matching action expert: one velocity evaluation over the chunk."""

    def __init__(self, shape: Pi0Shape) -> None:
        super().__init__()
        a = shape.spec.action
        t = a.transformer
        assert t is not None  # check_shape
        self.width = t.hidden
        self.action_in = Dense(a.dof, t.hidden)
        self.state_in = Dense(shape.state_dim, t.hidden)
        self.time_in = Dense(2 * t.hidden, t.hidden)
        self.time_out = Dense(t.hidden, t.hidden)
        self.blocks = nn.ModuleList(DecoderBlock(t) for _ in range(t.layers))
        self.norm = RMSNorm(t.hidden)
        self.action_out = Dense(t.hidden, a.dof)
        layers_b = shape.spec.backbone.transformer.layers
        # Expert layer i attends backbone layer i (π0: equal depth); a smaller model with
        # other depths spreads its layers over the backbone's evenly, the last attending the
        # last (so every backbone layer is computed, none is dead code to an exporter).
        self.cache_layer = [(i + 1) * layers_b // t.layers - 1 for i in range(t.layers)]

    def forward(
        self,
        x: torch.Tensor,
        t: torch.Tensor,
        state: torch.Tensor,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        bias: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        emb = time_embedding(t, self.width).to(x.dtype)[:, None].expand(-1, x.shape[1], -1)
        h = self.time_in(torch.cat([self.action_in(x), emb], dim=-1))
        h = self.time_out(F.silu(h)) + state[:, None]
        for block, j in zip(self.blocks, self.cache_layer, strict=True):
            q, k, v = cast(DecoderBlock, block).project(h, cos, sin)
            kp, vp = cache[j]
            h = cast(DecoderBlock, block).finish(h, q, torch.cat([kp, k], dim=2), torch.cat([vp, v], dim=2), bias)
        return self.action_out(self.norm(h))


def time_embedding(t: torch.Tensor, d: int) -> torch.Tensor:
    """π0's sinusoidal embedding of the flow time ``t`` ``[B]`` -> ``[B, d]`` (float32)."""
    frac = torch.linspace(0.0, 1.0, d // 2, dtype=torch.float32, device=t.device)
    period = TIME_MIN_PERIOD * (TIME_MAX_PERIOD / TIME_MIN_PERIOD) ** frac
    ang = t.float()[:, None] * (2 * math.pi / period)[None]
    return torch.cat([ang.sin(), ang.cos()], dim=-1)


class Pi0(nn.Module):
    """The whole policy. ``forward`` is the exported graph: camera images, language tokens,
    state and noise in (contract order), the action chunk out."""

    rope_cos: torch.Tensor
    rope_sin: torch.Tensor

    def __init__(self, shape: Pi0Shape) -> None:
        super().__init__()
        check_shape(shape)
        self.shape = shape
        s = shape.spec
        self.vision = Vision(shape)
        self.backbone = Backbone(shape)
        self.expert = Expert(shape)
        self.steps = s.action.steps
        self.prefix_len = s.prefix_tokens
        cos, sin = rope_tables(s.prefix_tokens + s.action.chunk, s.backbone.transformer.head_dim)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    @property
    def dtype(self) -> torch.dtype:
        return self.backbone.embed.weight.dtype

    def prefix_bias(self, tokens: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Additive key mask over prefix (+ chunk) positions: padded language tokens get -inf."""
        b = tokens.shape[0]
        images = self.prefix_len - tokens.shape[1]
        pad = torch.cat(
            [torch.zeros(b, images, dtype=torch.bool, device=tokens.device), tokens == self.shape.pad_id], 1
        )
        neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=tokens.device)
        return torch.where(pad, neg, torch.zeros((), dtype=dtype, device=tokens.device))[:, None, None]

    # The three components the planner predicts apart, in order; ``forward`` is their
    # composition (and what is exported), a benchmark can time each.

    def image_tokens(self, *images: torch.Tensor) -> torch.Tensor:
        """Vision: the cameras' images -> ``[B, cameras x tokens, backbone width]``."""
        b = images[0].shape[0]
        pixels = torch.cat([im.to(self.dtype) for im in images], dim=0)  # cameras as the batch
        vis = self.vision(pixels)
        return vis.reshape(len(images), b, vis.shape[1], vis.shape[2]).transpose(0, 1).reshape(b, -1, vis.shape[2])

    def prefix_cache(self, image_tokens: torch.Tensor, tokens: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Backbone: the KV cache of the prefix (images, then language)."""
        n = self.prefix_len
        bias = self.prefix_bias(tokens, self.dtype)
        return self.backbone(image_tokens, tokens, bias, self.rope_cos[:n], self.rope_sin[:n])

    def denoise(
        self,
        cache: list[tuple[torch.Tensor, torch.Tensor]],
        tokens: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        """Action: ``steps`` Euler steps of the expert from the noise (t = 1) to actions (t = 0)."""
        dtype = self.dtype
        n = self.prefix_len
        bias = self.prefix_bias(tokens, dtype)
        bias = torch.cat([bias, torch.zeros(*bias.shape[:3], noise.shape[1], dtype=dtype, device=bias.device)], -1)
        cos, sin = self.rope_cos[n:], self.rope_sin[n:]
        state_h = self.expert.state_in(state.to(dtype))
        x = noise.to(dtype)
        dt = 1.0 / self.steps
        for k in range(self.steps):
            t = torch.full((x.shape[0],), 1.0 - k * dt, dtype=torch.float32, device=x.device)
            x = x - dt * self.expert(x, t, state_h, cache, bias, cos, sin)
        return x.float()

    def forward(
        self,
        image_base: torch.Tensor,
        image_left_wrist: torch.Tensor,
        image_right_wrist: torch.Tensor,
        tokens: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
    ) -> torch.Tensor:
        cache = self.prefix_cache(self.image_tokens(image_base, image_left_wrist, image_right_wrist), tokens)
        return self.denoise(cache, tokens, state, noise)


def build(shape: Pi0Shape, *, seed: int = 0, dtype: str = "fp32", device: str | torch.device = "cpu") -> Pi0:
    """The model with :func:`init_tensor` weights in ``dtype`` on ``device``, in eval mode.

    Built on the meta device first, so only the final weights are ever allocated."""
    if dtype not in DTYPES:
        raise PlannerError(f"unknown dtype {dtype!r} (one of {', '.join(DTYPES)})")
    model = empty(shape, DTYPES[dtype], torch.device("meta")).to_empty(device=device)
    cos, sin = rope_tables(shape.spec.prefix_tokens + shape.spec.action.chunk, shape.spec.backbone.transformer.head_dim)
    model.rope_cos, model.rope_sin = cos.to(device), sin.to(device)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(init_tensor(name, tuple(p.shape), p.dtype, seed).to(device))
    return model.eval()


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(before)


def empty(shape: Pi0Shape, dtype: torch.dtype = torch.float32, device: torch.device | None = None) -> Pi0:
    """The module with parameters in ``dtype`` that hold no values yet: on ``device``
    (``meta``: nothing allocated) or under an active fake-tensor mode (an exporter's)."""
    with _default_dtype(dtype), torch.device(device) if device is not None else contextlib.nullcontext():
        return Pi0(shape).eval()


def parameters(shape: Pi0Shape) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Name and shape of every parameter, without allocating any."""
    for name, p in empty(shape, device=torch.device("meta")).named_parameters():
        yield name, tuple(p.shape)


def parameter_count(shape: Pi0Shape) -> dict[str, int]:
    """Parameters per top-level module (vision, backbone, expert) and in total."""
    out: dict[str, int] = {}
    for name, dims in parameters(shape):
        top = name.split(".", 1)[0]
        out[top] = out.get(top, 0) + math.prod(dims)
    out["total"] = sum(out.values())
    return out
