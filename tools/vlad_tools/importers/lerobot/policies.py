"""LeRobot policies as exportable graphs, and LeRobot's own inference as the reference.

Per supported policy type, two things:

- an export module: normalized contract inputs (positional, in ``[[inputs]]`` order) ->
  normalized action chunk, calling the policy's own submodules. ACT is deterministic at
  inference (its latent is zero). Diffusion Policy samples: the module takes the initial
  noise (and, with DDPM, each step's noise) as its ``noise`` input and runs the denoising
  loop with the checkpoint's scheduler unrolled over its fixed timesteps (the scheduler's
  arithmetic, written out; :func:`check_against_lerobot` proves it equal). SmolVLA samples
  by flow matching: its module takes the noise and the real-time chunking inputs and runs
  LeRobot's own prefix, cache and denoising steps (:func:`_smolvla_module`);
- the reference: raw robot frames -> LeRobot's ``prepare_observation_for_inference`` ->
  the checkpoint's preprocessor -> ``predict_action_chunk`` (Diffusion: after filling
  its observation queue with LeRobot's ``populate_queues``, one frame at a time) -> the
  postprocessor.

Each also exposes ``prefix`` (an intermediate tensor: ACT's backbone features, Diffusion's
global conditioning, SmolVLA's prefix embeddings) that :func:`vlad.release.export.export_onnx` compares as well.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from vlad_tools.importers.lerobot.checkpoint import STATE, Checkpoint, CheckpointError


@dataclass
class Frame:
    """One raw robot observation as LeRobot's robots deliver it: uint8 HWC images by
    LeRobot camera name, the state vector, the instruction (LeRobot's ``task``; read by
    SmolVLA only)."""

    images: dict[str, np.ndarray]
    state: np.ndarray
    task: str = ""


def load_policy(ckpt: Checkpoint, vlm_dir: Path | None = None):
    """The policy and its processors, loaded by LeRobot from the checkpoint folder (CPU, eval).

    SmolVLA: its VLM's configuration, tokenizer and processor come from ``vlm_dir`` (a
    checked :class:`~vlad_tools.importers.lerobot.vlm.VLMFolder` path), in place of the
    hub id the checkpoint names; no VLM weights are loaded from it.

    The weights are loaded strictly: ``model.safetensors`` must hold exactly the tensors the
    configuration builds, with their shapes (LeRobot's ``from_pretrained`` is lenient: a
    missing tensor stays randomly initialised, with a warning on stderr), and every one of them
    finite (a diverged run's NaN weights otherwise compare equal to LeRobot's NaN outputs).
    Each problem is a one-line :class:`CheckpointError`.
    """
    from vlad_tools.importers.lerobot.runtime import load_lerobot

    load_lerobot()
    from lerobot.configs.policies import PreTrainedConfig
    from lerobot.policies.factory import get_policy_class, make_pre_post_processors

    try:
        config = PreTrainedConfig.from_pretrained(str(ckpt.path), local_files_only=True)
        config.device = "cpu"
        # Every backbone weight comes from model.safetensors (loaded strictly below): no
        # download of the ImageNet weights the backbone was initialised with before training.
        if getattr(config, "pretrained_backbone_weights", None) is not None:
            config.pretrained_backbone_weights = None
        overrides: dict[str, dict[str, Any]] = {"device_processor": {"device": "cpu"}}
        if ckpt.type == "smolvla":
            if vlm_dir is None:
                raise CheckpointError("SmolVLA needs its vision-language model's folder (--vlm-dir)")
            config.vlm_model_name = str(vlm_dir)
            config.load_vlm_weights = False  # every weight comes from model.safetensors
            overrides["tokenizer_processor"] = {"tokenizer_name": str(vlm_dir)}
        with contextlib.redirect_stdout(io.StringIO()):  # SmolVLA prints what it builds
            policy = get_policy_class(ckpt.type)(config)
    except Exception as exc:  # LeRobot's own validation of config.json: its reason, in one line
        raise CheckpointError(f"{ckpt.path}/config.json: LeRobot cannot build the policy: {_first_line(exc)}") from exc
    _load_weights_strictly(policy, ckpt)
    policy.eval()
    try:
        pre, post = make_pre_post_processors(
            config,
            pretrained_path=str(ckpt.path),
            preprocessor_overrides=overrides,
            postprocessor_overrides={"device_processor": {"device": "cpu"}},
        )
    except Exception as exc:
        raise CheckpointError(f"{ckpt.path}: LeRobot cannot load the processors: {_first_line(exc)}") from exc
    return policy, pre, post


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _load_weights_strictly(policy, ckpt: Checkpoint) -> None:
    """``model.safetensors`` into ``policy`` as LeRobot's ``from_pretrained`` loads it
    (``safetensors.torch.load_model``), but strict, and every tensor checked finite."""
    import torch
    from safetensors.torch import load_model

    path = ckpt.path / "model.safetensors"
    expected = {k: tuple(v.shape) for k, v in policy.state_dict().items()}
    missing = sorted(set(expected) - set(ckpt.weights))
    unexpected = sorted(set(ckpt.weights) - set(expected))
    shapes = sorted(k for k in set(expected) & set(ckpt.weights) if ckpt.weights[k][0] != expected[k])
    for what, keys in (
        ("lacks {n} tensor(s) the policy config.json describes has", missing),
        ("holds {n} tensor(s) the policy config.json describes does not have", unexpected),
    ):
        if keys:
            shown = ", ".join(keys[:3]) + (", ..." if len(keys) > 3 else "")
            raise CheckpointError(
                f"{path}: {what.format(n=len(keys))} ({shown}): the weights and config.json are not from one "
                "checkpoint; copy the whole pretrained_model folder again"
            )
    if shapes:
        k = shapes[0]
        raise CheckpointError(
            f"{path}: tensor {k} has shape {list(ckpt.weights[k][0])}, the policy config.json describes needs "
            f"{list(expected[k])}: the weights and config.json are not from one checkpoint"
        )
    try:
        load_model(policy, str(path), strict=True, device="cpu")
    except Exception as exc:  # the header was read; anything left is a damaged file
        raise CheckpointError(f"{path}: cannot load the weights: {_first_line(exc)}") from exc
    bad = [k for k, v in policy.state_dict().items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise CheckpointError(
            f"{path}: {len(bad)} tensor(s) hold NaN or Inf ({bad[0]}{', ...' if len(bad) > 1 else ''}): "
            "the training diverged; import an earlier checkpoint"
        )


# ---------------------------------------------------------------------------------------
# Export modules
# ---------------------------------------------------------------------------------------


def export_module(policy, ckpt: Checkpoint, input_names: Sequence[str], pad_id: int = 0):
    """The ``torch.nn.Module`` to export for ``policy`` (eval mode). Its ``forward`` takes the
    contract's inputs positionally and is *named* after them (``torch.export`` binds the
    contract's dynamic axes to parameter names). ``pad_id``: SmolVLA's padding token."""
    import inspect

    if ckpt.type == "act":
        module = _act_module(policy)
    elif ckpt.type == "smolvla":
        module = _smolvla_module(policy, ckpt, pad_id)
    else:
        module = _diffusion_module(policy, ckpt)
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)] + [
        inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in input_names
    ]
    type(module).forward.__signature__ = inspect.Signature(params)
    return module.eval()


def _act_module(policy):
    import torch
    from lerobot.utils.constants import OBS_IMAGES, OBS_STATE

    class ActExport(torch.nn.Module):
        """cameras..., state -> actions ``[N, chunk_size, action dim]`` (normalized)."""

        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner  # ACT's model: backbone, encoder, decoder, action head

        def forward(self, *args):
            *images, state = args
            actions, _ = self.inner({OBS_STATE: state, OBS_IMAGES: list(images)})
            return actions

        def prefix(self, *args):
            return self.inner.backbone(args[0])["feature_map"]

    return ActExport(policy.model)


@dataclass(frozen=True)
class _Step:
    """One denoising step's constants, computed with the scheduler's own float32 arithmetic."""

    t: int
    x0_from_sample: float  # epsilon: 1 / sqrt(a_t) etc. (see _scheduler_steps)
    x0_from_output: float
    eps_from_sample: float
    eps_from_output: float
    prev_from_x0: float
    prev_from_sample_or_eps: float
    noise_scale: float  # DDPM: sqrt(variance) (0 at t = 0); DDIM: 0


def _scheduler_steps(scheduler, steps: int, kind: str) -> list[_Step]:
    """The scheduler's step as constants per timestep (diffusers' DDPM/DDIM ``step``, eta = 0)."""
    import torch

    cfg = scheduler.config
    scheduler.set_timesteps(steps)
    ac = scheduler.alphas_cumprod
    stride = cfg.num_train_timesteps // steps
    one = torch.tensor(1.0)
    out = []
    for t in (int(x) for x in scheduler.timesteps):
        prev_t = t - stride
        a_t = ac[t]
        if kind == "DDIM":
            a_prev = ac[prev_t] if prev_t >= 0 else scheduler.final_alpha_cumprod
        else:
            a_prev = ac[prev_t] if prev_t >= 0 else one
        b_t = 1 - a_t
        pt = cfg.prediction_type
        # pred_x0 = x0_from_sample * sample + x0_from_output * model_output, written as the
        # scheduler writes it: (sample - b_t**0.5 * out) / a_t**0.5 keeps its rounding.
        if pt not in ("epsilon", "sample"):
            raise ValueError(f"prediction_type {pt!r}")
        if kind == "DDIM":
            # prev = a_prev**0.5 * x0 + (1 - a_prev)**0.5 * eps
            c_x0, c_other, scale = float(a_prev**0.5), float((1 - a_prev) ** 0.5), 0.0
        else:
            b_prev = 1 - a_prev
            cur_alpha = a_t / a_prev
            cur_beta = 1 - cur_alpha
            c_x0 = float((a_prev**0.5 * cur_beta) / b_t)
            c_other = float(cur_alpha**0.5 * b_prev / b_t)
            var = torch.clamp((1 - a_prev) / (1 - a_t) * cur_beta, min=1e-20)
            scale = float(var**0.5) if t > 0 else 0.0
        out.append(_Step(t, float(b_t**0.5), float(a_t**0.5), float(a_t**0.5), float(b_t**0.5), c_x0, c_other, scale))
    return out


def _diffusion_module(policy, ckpt: Checkpoint):
    import torch
    from lerobot.utils.constants import OBS_IMAGES, OBS_STATE

    cfg = ckpt.config
    kind = cfg.get("noise_scheduler_type", "DDPM")
    if kind not in ("DDPM", "DDIM"):
        raise ValueError(f"noise_scheduler_type {kind!r}")
    model = policy.diffusion
    steps = _scheduler_steps(model.noise_scheduler, model.num_inference_steps, kind)
    clip = float(cfg["clip_sample_range"]) if cfg.get("clip_sample") else None
    prediction = cfg.get("prediction_type", "epsilon")
    start = ckpt.n_obs_steps - 1
    n_action = ckpt.n_action_steps

    class DiffusionExport(torch.nn.Module):
        """cameras ``[N, T, 3, H, W]``..., state ``[N, T, D]``, noise -> actions (normalized)."""

        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner  # DiffusionModel: the RGB encoder(s) and the 1-D U-Net

        def prefix(self, *args):
            *images, state, _noise = args
            batch = {OBS_STATE: state, OBS_IMAGES: torch.stack(images, dim=-4)}
            return self.inner._prepare_global_conditioning(batch)

        def forward(self, *args):
            noise = args[-1]
            cond = self.prefix(*args)
            sample = noise[:, 0] if kind == "DDPM" else noise
            timestep = torch.ones(sample.shape[:1], dtype=torch.long)
            for i, s in enumerate(steps):
                out = self.inner.unet(sample, timestep * s.t, global_cond=cond)
                if prediction == "epsilon":
                    x0 = (sample - s.x0_from_sample * out) / s.x0_from_output
                    eps = out
                else:
                    x0 = out
                    eps = (sample - s.eps_from_sample * x0) / s.eps_from_output
                if clip is not None:
                    x0 = x0.clamp(-clip, clip)
                if kind == "DDIM":
                    sample = s.prev_from_x0 * x0 + s.prev_from_sample_or_eps * eps
                else:
                    sample = s.prev_from_x0 * x0 + s.prev_from_sample_or_eps * sample
                    if s.noise_scale:
                        sample = sample + s.noise_scale * noise[:, 1 + i]
            return sample[:, start : start + n_action]

    return DiffusionExport(model)


def _smolvla_module(policy, ckpt: Checkpoint, pad_id: int):
    """SmolVLA's ``sample_actions`` with the noise, and real-time chunking, as inputs.

    cameras ``[N, 3, H, W]``..., tokens ``[N, L]`` (padded with ``pad_id``), state ``[N, D]``,
    noise ``[N, chunk, max_action_dim]``, rtc_actions ``[N, chunk, action dim]``, rtc_weights
    ``[N, chunk]`` -> actions ``[N, chunk, action dim]`` (normalized).

    LeRobot's own steps, in its order: each image resized with padding and mapped to [-1, 1]
    (``prepare_images``), the state padded to ``max_state_dim``, the language mask, the
    prefix embedded and run once through the VLM (its keys and values cached), then
    ``num_steps`` Euler steps of the action expert from ``time = 1`` (noise) to 0
    (``denoise_step``), the action unpadded. The language mask is ``tokens != pad_id``:
    LeRobot pads only to the longest task of a batch, the contract to ``max_tokens``; the
    padding is masked out of the attention either way.

    Real-time chunking by inpainting (docs/contract.md ``[rtc]``, as the demo policy does
    it): before every step the action entries are pulled towards the straight path from the
    noise to ``rtc_actions`` at that step's time, after the last towards ``rtc_actions``, each
    pull by the share of the waypoint's weight that makes the pulls together pull by it; the
    padded entries stay free. All-zero weights compute exactly LeRobot's chunk.
    """
    import torch
    from lerobot.policies.smolvla.modeling_smolvla import make_att_2d_masks, pad_vector, resize_with_pad

    cfg = policy.config
    steps = int(cfg.num_steps)
    adim = ckpt.action.shape[0]
    n_cams = len(ckpt.cameras)
    resize = tuple(cfg.resize_imgs_with_padding) if cfg.resize_imgs_with_padding is not None else None

    embeddings = policy.model.vlm_with_expert.get_vlm_model().vision_model.embeddings

    def full_image_embeddings(pixel_values, patch_attention_mask=None):
        """transformers' ``SmolVLMVisionEmbeddings.forward`` for whole images (SmolVLA's: no
        patch is masked), its per-sample loop, which fixes the batch size, done once: every
        sample has the same position ids, computed by the same operations from the image size."""
        del patch_attention_mask  # None: SmolVLA's images are whole
        _, _, h, w = pixel_values.shape
        patches = embeddings.patch_embedding(pixel_values).flatten(2).transpose(1, 2)
        side = embeddings.num_patches_per_side
        boundaries = torch.arange(1 / side, 1.0, 1 / side)
        nb_h, nb_w = h // embeddings.patch_size, w // embeddings.patch_size
        rows = torch.bucketize(torch.arange(nb_h, dtype=pixel_values.dtype) / nb_h * (1 - 1e-6), boundaries, right=True)
        cols = torch.bucketize(torch.arange(nb_w, dtype=pixel_values.dtype) / nb_w * (1 - 1e-6), boundaries, right=True)
        ids = (rows[:, None] * side + cols).flatten()
        return patches + embeddings.position_embedding(ids)[None]

    @contextlib.contextmanager
    def batch_free_vision():
        embeddings.forward = full_image_embeddings  # this instance only, while the export module runs
        try:
            yield
        finally:
            del embeddings.forward

    class SmolVLAExport(torch.nn.Module):
        def __init__(self, inner) -> None:
            super().__init__()
            self.inner = inner  # VLAFlowMatching: the VLM with its action expert, the projections
            self.register_buffer(
                "action_entries", (torch.arange(int(cfg.max_action_dim)) < adim).float()[None, None], persistent=False
            )

        def context(self, images, tokens, state):
            """The prefix (images, language, state) through the VLM: embeddings, mask, cache."""
            prepared, masks = [], []
            for img in images:
                if resize is not None:
                    img = resize_with_pad(img, *resize, pad_value=0)
                prepared.append(img * 2.0 - 1.0)
                masks.append(tokens[:, 0] == tokens[:, 0])  # all true, [N]
            embs, pad_masks, att_masks = self.inner.embed_prefix(
                prepared, masks, tokens, tokens != pad_id, state=pad_vector(state, int(cfg.max_state_dim))
            )
            _, cache = self.inner.vlm_with_expert.forward(
                attention_mask=make_att_2d_masks(pad_masks, att_masks),
                position_ids=torch.cumsum(pad_masks, dim=1) - 1,
                past_key_values=None,
                inputs_embeds=[embs, None],
                use_cache=True,
                fill_kv_cache=True,
            )
            return embs, pad_masks, cache

        def prefix(self, *args):
            with batch_free_vision():
                return self.context(list(args[:n_cams]), args[n_cams], args[n_cams + 1])[0]

        def forward(self, *args):
            images, (tokens, state, noise, rtc_actions, rtc_weights) = list(args[:n_cams]), args[n_cams:]
            with batch_free_vision():
                _, pad_masks, cache = self.context(images, tokens, state)
            target = pad_vector(rtc_actions, int(cfg.max_action_dim))
            share = 1.0 - (1.0 - rtc_weights.clamp(0.0, 1.0)) ** (1.0 / (steps + 1))
            w = share[:, :, None] * self.action_entries
            x = noise
            dt = -1.0 / steps
            for k in range(steps):
                tk = k / steps  # vlad's time: 0 at the noise, 1 at the chunk (LeRobot's time is 1 - tk)
                x = x + w * ((1.0 - tk) * noise + tk * target - x)
                t = x[:, 0, 0] * 0.0 + (1.0 + k * dt)  # LeRobot's time, with the batch size symbolic
                v = self.inner.denoise_step(prefix_pad_masks=pad_masks, past_key_values=cache, x_t=x, timestep=t)
                x = x + dt * v
            x = x + w * (target - x)
            return x[:, :, :adim]

        def flow_head(self):
            """The flow head as two modules for real-time chunking by guidance
            (``vlad_torch.guided``), in vlad's time (0 at the noise, 1 at the chunk)"""
            return SmolVLAEncoder(self), SmolVLAVelocity(self)

    class SmolVLAEncoder(torch.nn.Module):
        """cameras..., tokens, state -> the prefix's pad mask ``[N, P]`` and its cached keys
        and values (two per VLM layer, in layer order): what every denoising step reads."""

        def __init__(self, export) -> None:
            super().__init__()
            self.export = export

        def forward(self, *args):
            with batch_free_vision():
                _, pad_masks, cache = self.export.context(list(args[:n_cams]), args[n_cams], args[n_cams + 1])
            return (pad_masks, *(cache[k][s] for k in sorted(cache) for s in ("key_states", "value_states")))

    class SmolVLAVelocity(torch.nn.Module):
        """``(pad mask, keys and values..., x [N, chunk, max_action_dim], t [N])`` -> the
        velocity in vlad's time: ``-denoise_step(x, 1 - t)`` (LeRobot integrates
        ``x + dt * v`` with ``dt = -1 / steps`` from its time 1 down to 0)."""

        def __init__(self, export) -> None:
            super().__init__()
            self.export = export

        def forward(self, *args):
            pad_masks, *kv, x, t = args
            layers = range(len(kv) // 2)
            cache = {i: {"key_states": kv[2 * i], "value_states": kv[2 * i + 1]} for i in layers}
            v = self.export.inner.denoise_step(
                prefix_pad_masks=pad_masks, past_key_values=cache, x_t=x, timestep=1.0 - t
            )
            return -v

    return SmolVLAExport(policy.model)


# ---------------------------------------------------------------------------------------
# LeRobot's own inference, the reference
# ---------------------------------------------------------------------------------------


def _lerobot_obs(frame: Frame) -> dict[str, Any]:
    """A robot observation in LeRobot's key scheme, through its own conversion."""
    import torch
    from lerobot.policies.utils import prepare_observation_for_inference

    obs: dict[str, Any] = {f"observation.images.{k}": np.ascontiguousarray(v) for k, v in frame.images.items()}
    obs[STATE] = np.asarray(frame.state, np.float32)
    return prepare_observation_for_inference(obs, torch.device("cpu"), task=frame.task)


@dataclass
class Reference:
    """LeRobot's answer to one observation window."""

    inputs: dict[str, np.ndarray]  # LeRobot's preprocessed tensors of the newest frame (normalized)
    output: np.ndarray  # predict_action_chunk: [1, chunk, action dim], normalized
    actions: np.ndarray  # after the postprocessor: [chunk, action dim], physical units


def lerobot_reference(
    policy, pre, post, ckpt: Checkpoint, window: Sequence[Frame], noise: np.ndarray | None, seed: int = 0
) -> Reference:
    """LeRobot's inference on ``window`` (oldest first; one frame without history).

    Diffusion: ``policy.reset()``, then LeRobot's ``populate_queues`` with each frame (the
    first one fills the queue, as after a reset), then ``predict_action_chunk`` with the
    initial noise ``noise[0]`` (DDIM: ``noise`` itself). A DDPM checkpoint's per-step noise
    cannot be handed to LeRobot: its scheduler draws it from torch's generator, seeded here
    with ``seed``, and :func:`seeded_ddpm_noise` gives the same values for the export.
    """
    import torch

    with torch.inference_mode():
        batches = [pre(_lerobot_obs(f)) for f in window]
        batch = batches[-1]
        if ckpt.type == "act":
            out = policy.predict_action_chunk(batch)
        elif ckpt.type == "smolvla":
            assert noise is not None  # a SmolVLA contract has a noise input
            policy.reset()
            out = policy.predict_action_chunk(batch, noise=torch.from_numpy(np.ascontiguousarray(noise)))
        else:
            from lerobot.policies.utils import populate_queues
            from lerobot.utils.constants import OBS_IMAGES

            policy.reset()
            for b in batches:
                b = {k: v for k, v in b.items() if isinstance(v, torch.Tensor)}
                b[OBS_IMAGES] = torch.stack([b[k] for k in policy.config.image_features], dim=-4)
                policy._queues = populate_queues(policy._queues, b)
            assert noise is not None  # a diffusion contract has a noise input
            initial = noise[:, 0] if noise.ndim == 4 else noise
            b = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            b[OBS_IMAGES] = torch.stack([b[k] for k in policy.config.image_features], dim=-4)
            torch.manual_seed(seed)
            out = policy.predict_action_chunk(b, noise=torch.from_numpy(np.ascontiguousarray(initial)))
        actions = post(out)
    inputs = {k: v.numpy().copy() for k, v in batch.items() if isinstance(v, torch.Tensor)}
    return Reference(inputs, out.numpy().copy(), np.asarray(actions)[0].astype(np.float32))


def smolvla_guided_reference(module, contract, inputs: dict[str, np.ndarray], guidance: float) -> np.ndarray:
    """Real-time chunking by guidance written in LeRobot's own time, the reference the release's
    guided programs are checked against: the eager prefix (``module.context``), then
    ``num_steps`` Euler steps ``x + dt * v`` with ``dt = -1 / steps`` from LeRobot's time 1 (the
    noise) to 0, each velocity of ``denoise_step`` corrected by the vector-Jacobian product of
    the weighted distance between the waypoints and the chunk the step predicts,
    ``x - time * v`` (the paper's guidance, as ``vlad_torch.guided`` computes it in its own
    time ``tau = 1 - time``). The waypoints and weights cover the action's columns of the
    ``max_action_dim``-wide state. Returns the normalized chunk ``[N, chunk, action dim]``.

    LeRobot's own ``RTCProcessor`` (0.4.4) is no reference for this: it calls the denoiser
    before ``x_t`` requires a gradient, so its correction is the weighted error itself (no
    product through the policy), and it guides the padded columns towards zero.
    """
    import torch

    rtc, noise_spec = contract.rtc, contract.noise
    adim, steps = contract.action.dim, noise_spec.denoising_steps
    names = [s.name for s in contract.inputs]
    skip = {noise_spec.input, rtc.actions_input, rtc.weights_input}
    observation = [torch.from_numpy(np.ascontiguousarray(inputs[n])) for n in names if n not in skip]
    encoder, _ = module.flow_head()
    with torch.no_grad():
        pad_masks, *kv = encoder(*observation)
    cache = {i: {"key_states": kv[2 * i], "value_states": kv[2 * i + 1]} for i in range(len(kv) // 2)}
    x = torch.from_numpy(np.ascontiguousarray(inputs[noise_spec.input]))
    free = x.shape[-1] - adim
    target = torch.nn.functional.pad(torch.from_numpy(inputs[rtc.actions_input]), (0, free))
    w = torch.from_numpy(inputs[rtc.weights_input])[..., None].expand(-1, -1, adim)
    weights = torch.nn.functional.pad(w, (0, free))
    guided = bool((weights > 0).any())
    dt = -1.0 / steps

    def velocity(x_t, time):
        t = torch.full((x_t.shape[0],), time, dtype=torch.float32)
        return module.inner.denoise_step(prefix_pad_masks=pad_masks, past_key_values=cache, x_t=x_t, timestep=t)

    for step in range(steps):
        time = 1.0 + step * dt
        if guided:
            with torch.enable_grad():
                xg = x.detach().requires_grad_(True)
                v = velocity(xg, time)
                predicted = xg - time * v
                (correction,) = torch.autograd.grad(predicted, xg, weights * (target - predicted))
            tau = 1.0 - time
            r2 = time**2 / (tau**2 + time**2)
            weight = guidance if tau == 0.0 else min(guidance, time / (tau * r2))
            v = v.detach() - weight * correction
        else:
            with torch.no_grad():
                v = velocity(x, time)
        x = (x + dt * v).detach()
    return x[:, :, :adim].numpy()


def seeded_ddpm_noise(ckpt: Checkpoint, seed: int, batch: int = 1) -> np.ndarray:
    """The per-step noise LeRobot's DDPM scheduler draws after ``torch.manual_seed(seed)``:
    one ``torch.randn`` per step with ``t > 0``, in step order (diffusers' ``randn_tensor`` on
    the CPU). Slot 0 is the initial sample's (handed to LeRobot explicitly); the slot of the
    final step (t = 0, no noise added) stays zero."""
    import torch

    from vlad_tools.importers.lerobot.contract import denoising_steps, noise_shape

    shape = noise_shape(ckpt)
    assert shape is not None and len(shape) == 3
    out = np.zeros((batch, *shape), np.float32)
    g = torch.Generator().manual_seed(seed + 1)
    out[:, 0] = torch.randn((batch, *shape[1:]), generator=g).numpy()
    torch.manual_seed(seed)
    for i in range(denoising_steps(ckpt) - 1):  # DDPM's timesteps end at t = 0
        out[:, 1 + i] = torch.randn((batch, *shape[1:])).numpy()
    return out
