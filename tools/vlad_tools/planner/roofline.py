"""The roofline: operators, their FLOPs and bytes, and the time each takes on hardware.

Per operator (source A, VLA-Perf / GenZ ``operator_base.py``)::

    t = max(2 * MACs / peak_flops[precision], bytes / bandwidth)

where bytes are the operator's input activations, weights and output, each read or
written at the device-memory bandwidth, or at the on-chip bandwidth when the operator
keeps that tensor on chip (a fused attention keeps its score matrix there; the action
expert's small activations stay on chip between operators). An operator is
compute-bound when the compute term wins.

Components (each a list of operators, summed):

* vision: a ViT prefill over ``tokens_per_image`` tokens with the cameras as the batch,
  or the convolutions of a conv encoder;
* backbone: prefill of the whole prefix (images, language, state tokens);
* action, flow: ``steps`` passes of the expert over the chunk's tokens, each attending
  the prefix (its KV cache, or a cross-attention K/V projected once) and the chunk;
* action, autoregressive: one backbone decode step per action token, KV cache growing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from vlad_tools.planner.spec import BYTES_PER_ELEMENT, Hardware, Transformer, VLAModel


@dataclass(frozen=True)
class Op:
    """One operator: multiply-accumulates and tensor sizes in elements.

    ``on_chip`` names the tensors ("a" input, "w" weights or second operand, "o" output)
    that stay on chip. ``repeat`` counts identical executions (layers, steps).
    """

    name: str
    macs: float
    a: float
    w: float
    o: float
    on_chip: str = ""
    repeat: int = 1
    weights: bool = True  # "w" is a parameter tensor (False: K/V or another activation)


@dataclass(frozen=True)
class OpTime:
    """An operator's roofline times for all its repeats, in seconds."""

    op: Op
    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)


def op_time(op: Op, hw: Hardware, precision: str) -> OpTime:
    """Roofline time of ``op`` (all repeats) on ``hw`` at ``precision``."""
    size = BYTES_PER_ELEMENT[precision]
    compute = 2.0 * op.macs / hw.peak(precision)
    memory = 0.0
    for tensor, elements in (("a", op.a), ("w", op.w), ("o", op.o)):
        bw = hw.onchip_bandwidth if tensor in op.on_chip else hw.memory_bandwidth
        memory += elements * size / bw
    if op.macs == 0:  # a pure data-layout operator: source A leaves it out
        memory = 0.0
    return OpTime(op, compute * op.repeat, memory * op.repeat)


@dataclass(frozen=True)
class ComponentTime:
    """A component's roofline result: the sum over its operators."""

    name: str
    ops: tuple[OpTime, ...] = field(repr=False)

    @property
    def ms(self) -> float:
        return 1e3 * sum(t.seconds for t in self.ops)

    @property
    def compute_ms(self) -> float:
        return 1e3 * sum(t.compute_s for t in self.ops)

    @property
    def memory_ms(self) -> float:
        return 1e3 * sum(t.memory_s for t in self.ops)

    @property
    def bound(self) -> str:
        """ "compute" or "memory": which total is larger (as source A classifies components)."""
        return "compute" if self.compute_ms > self.memory_ms else "memory"

    @property
    def flops(self) -> float:
        return sum(2.0 * t.op.macs * t.op.repeat for t in self.ops)

    def bytes(self, precision: str) -> float:
        size = BYTES_PER_ELEMENT[precision]
        return sum((t.op.a + t.op.w + t.op.o) * size * t.op.repeat for t in self.ops)

    def to_dict(self, precision: str) -> dict:
        """JSON-able summary."""
        b = self.bytes(precision)
        return {
            "ms": round(self.ms, 6),
            "bound": self.bound,
            "compute_ms": round(self.compute_ms, 6),
            "memory_ms": round(self.memory_ms, 6),
            "gflop": round(self.flops / 1e9, 6),
            "mbytes": round(b / 1e6, 6),
            "intensity": round(self.flops / b, 3) if b else 0.0,
        }


def component_time(name: str, ops: Iterable[Op], hw: Hardware, precision: str) -> ComponentTime:
    """Roofline time of a list of operators."""
    return ComponentTime(name, tuple(op_time(op, hw, precision) for op in ops))


# ---- operator builders ----------------------------------------------------------------


def gemm(name: str, batch: int, rows: int, out: int, inner: int, on_chip: str = "", repeat: int = 1) -> Op:
    """``[batch, rows, inner] @ [inner, out]`` with a weight matrix."""
    return Op(name, batch * rows * out * inner, batch * rows * inner, out * inner, batch * rows * out, on_chip, repeat)


def attention(
    prefix: str,
    batch: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    queries: int,
    keys: int,
    repeat: int,
    activations_on_chip: bool = False,
) -> list[Op]:
    """Scores ``Q K^T`` and ``softmax(...) V`` of a fused attention: the score matrix
    stays on chip, K and V (``w``) come from memory; Q and the result too unless
    ``activations_on_chip``."""
    scores = batch * heads * queries * keys
    q = batch * heads * queries * head_dim
    kv = batch * kv_heads * keys * head_dim
    macs = scores * head_dim
    act = "ao" if activations_on_chip else ""
    return [
        Op(f"{prefix} scores", macs, q, kv, scores, act or "o", repeat, weights=False),
        Op(f"{prefix} values", macs, scores, kv, q, act or "a", repeat, weights=False),
    ]


def ffn(prefix: str, t: Transformer, batch: int, tokens: int, repeat: int, on_chip: str = "") -> list[Op]:
    up = t.ffn * (2 if t.gated_ffn else 1)
    return [
        gemm(f"{prefix} ffn up", batch, tokens, up, t.hidden, on_chip, repeat),
        gemm(f"{prefix} ffn down", batch, tokens, t.hidden, t.ffn, on_chip, repeat),
    ]


def prefill_ops(prefix: str, t: Transformer, batch: int, tokens: int) -> list[Op]:
    """One prefill pass of a transformer stack over ``tokens`` (fused attention)."""
    q, kv, n = t.heads * t.head_dim, t.kv_heads * t.head_dim, t.layers
    return [
        gemm(f"{prefix} qkv", batch, tokens, q + 2 * kv, t.hidden, repeat=n),
        *attention(f"{prefix} attention", batch, t.heads, t.kv_heads, t.head_dim, tokens, tokens, n),
        gemm(f"{prefix} out", batch, tokens, t.hidden, q, repeat=n),
        *ffn(prefix, t, batch, tokens, n),
    ]


def conv_ops(model: VLAModel) -> list[Op]:
    """The convolutions of a conv image encoder, cameras as the batch."""
    v = model.vision
    ops, c, h, w = [], v.in_channels, v.image_height, v.image_width
    for i, layer in enumerate(v.conv):
        ho = (h + 2 * layer.padding - layer.kernel) // layer.stride + 1
        wo = (w + 2 * layer.padding - layer.kernel) // layer.stride + 1
        k = layer.out_channels
        n = v.cameras * model.batch
        ops.append(
            Op(
                f"vision conv{i}",
                n * k * c * layer.kernel**2 * ho * wo,
                n * c * h * w,
                k * c * layer.kernel**2,
                n * k * ho * wo,
            )
        )
        c, h, w = k, ho, wo
    return ops


def vision_ops(model: VLAModel) -> list[Op]:
    """The image encoder over every camera."""
    v = model.vision
    if v.kind == "conv":
        return conv_ops(model)
    assert v.transformer is not None  # a ViT encoder always has one (parse_model)
    return prefill_ops("vision", v.transformer, model.batch * v.cameras, v.tokens_per_image)


def backbone_ops(model: VLAModel) -> list[Op]:
    """Prefill of the backbone over the prefix."""
    return prefill_ops("backbone", model.backbone.transformer, model.batch, model.prefix_tokens)


def flow_ops(model: VLAModel) -> list[Op]:
    """``steps`` passes of a flow/diffusion expert over the chunk (source A's "parallel
    decode"): activations stay on chip, weights, K/V and FFN inputs come from memory."""
    a, t, b = model.action, model.action.transformer, model.batch
    assert t is not None  # a flow head always has its own expert (parse_model)
    n, steps, tokens, ctx = t.layers, a.steps, a.chunk, model.prefix_tokens
    q, kv, reps = t.heads * t.head_dim, t.kv_heads * t.head_dim, t.layers * a.steps
    ops = []
    if a.context == "cross_attention":  # K/V of the prefix, projected once per observation
        d_ctx = model.backbone.transformer.hidden
        ops.append(gemm("action context kv (once)", b, ctx, 2 * kv, d_ctx, repeat=n))
        ops.append(gemm("action qkv", b, tokens, q + 2 * kv, t.hidden, "ao", reps))
        ops.append(gemm("action cross q", b, tokens, q, t.hidden, "ao", reps))
    else:
        ops.append(gemm("action qkv", b, tokens, q + 2 * kv, t.hidden, "ao", reps))
    ops += attention("action context attention", b, t.heads, t.kv_heads, t.head_dim, tokens, ctx, reps, True)
    if tokens > 1:
        ops += [gemm("action qkv (self)", b, tokens, q + 2 * kv, t.hidden, "ao", reps) for _ in range(a.qkv_passes - 1)]
        ops += attention("action self attention", b, t.heads, t.kv_heads, t.head_dim, tokens, tokens, reps, True)
    outs = 2 if a.context == "cross_attention" else 1
    ops += [gemm("action out", b, tokens, t.hidden, q, "ao", reps) for _ in range(outs)]
    ops += ffn("action", t, b, tokens, reps)
    return ops if steps else []


def autoregressive_ops(model: VLAModel) -> list[Op]:
    """One backbone decode step per action token; the KV cache grows by one each step."""
    a, t, b = model.action, model.backbone.transformer, model.batch
    q, kv, n = t.heads * t.head_dim, t.kv_heads * t.head_dim, t.layers
    ops = []
    for i in range(a.decode_tokens):
        ops.append(gemm("decode qkv", b, 1, q + 2 * kv, t.hidden, "ao", n))
        ops += attention("decode attention", b, t.heads, t.kv_heads, t.head_dim, 1, model.prefix_tokens + i, n, True)
        ops.append(gemm("decode out", b, 1, t.hidden, q, "ao", n))
        ops += ffn("decode", t, b, 1, n, "ao")
        if a.vocab:
            ops.append(gemm("decode classifier", b, 1, a.vocab, t.hidden))
    return ops


def action_ops(model: VLAModel) -> list[Op]:
    """The action head: flow expert x steps, or autoregressive decoding."""
    return flow_ops(model) if model.action.kind == "flow" else autoregressive_ops(model)


def component_ops(model: VLAModel) -> dict[str, list[Op]]:
    """Operators of the three compute components, in pipeline order."""
    return {"vision": vision_ops(model), "backbone": backbone_ops(model), "action": action_ops(model)}


# ---- memory footprint -----------------------------------------------------------------


def parameter_counts(model: VLAModel) -> dict[str, int]:
    """Parameters per component (norms included, biases left out)."""
    v = model.vision
    if v.kind == "conv":
        vision, c = 0, v.in_channels
        for layer in v.conv:
            vision += layer.out_channels * c * layer.kernel**2
            c = layer.out_channels
    else:
        assert v.transformer is not None  # a ViT encoder always has one (parse_model)
        vision = v.transformer.params
    b = model.backbone
    backbone = b.transformer.params + b.vocab * b.transformer.hidden
    action = 0
    if model.action.kind == "flow":
        t = model.action.transformer
        assert t is not None  # a flow head always has its own expert (parse_model)
        action = t.params
        if model.action.context == "cross_attention":  # cross-attention Q, K/V and output
            q, kv = t.heads * t.head_dim, t.kv_heads * t.head_dim
            action += t.layers * (t.hidden * q + b.transformer.hidden * 2 * kv + q * t.hidden)
    else:
        action = model.action.vocab * b.transformer.hidden
    return {"vision": vision, "backbone": backbone, "action": action}


def memory_footprint(model: VLAModel) -> dict[str, float]:
    """Bytes held on the device: weights, the prefix KV cache, the largest activation."""
    size = BYTES_PER_ELEMENT[model.precision]
    weights = sum(parameter_counts(model).values()) * size
    ctx = model.prefix_tokens + (model.action.decode_tokens if model.action.kind == "autoregressive" else 0)
    kv = model.backbone.transformer.kv_cache_elements(ctx) * model.batch * size
    activations = max(op.a + op.o for ops in component_ops(model).values() for op in ops) * size
    return {"weights": weights, "kv_cache": kv, "activations": activations, "total": weights + kv + activations}
