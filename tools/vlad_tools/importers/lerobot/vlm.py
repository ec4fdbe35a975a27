"""SmolVLA's vision-language model folder (``--vlm-dir``) and the tokenizer a release ships.

A SmolVLA checkpoint holds every weight (``model.safetensors``) but not the description of
its VLM: LeRobot builds the network from ``vlm_model_name`` (a hub id such as
``HuggingFaceTB/SmolVLM2-500M-Video-Instruct``), reading that model's ``config.json``, its
tokenizer and its processor; ``load_vlm_weights = False`` still reads them. Offline, the user
points the importer at a local folder holding them (``huggingface-cli download MODEL
--local-dir DIR`` on a machine with the hub, or a copy of the hub cache's snapshot); no
VLM weights are read from it.

Checked here, each problem one line: the folder exists; it holds ``config.json`` (a
``smolvlm`` model), ``tokenizer.json``, ``tokenizer_config.json`` and the processor's
``preprocessor_config.json``; the configuration's dimensions are those of the checkpoint's
weights (text width, vocabulary, vision width, patch size, patch grid, text layers), and the
tokenizer fits the embedding table.

The release's tokenizer (:func:`write_release_tokenizer`) is the folder's ``tokenizer.json``
with one normalizer added: LeRobot's SmolVLA preprocessor appends a newline to a task that
does not end with one (``SmolVLANewLineProcessor``) before tokenizing, so the shipped file
does the same (``Replace(/\\n?\\z/, "\\n")``); vlad's ``Tokenizer`` then gives LeRobot's ids.
The model's attention mask over the language tokens is ``tokens != pad_id`` (LeRobot's
processor masks its padding; the export derives the same mask from the padded ids).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vlad.files import sha256_file
from vlad_tools.importers.lerobot.checkpoint import Checkpoint, CheckpointError

VLM_PREFIX = "model.vlm_with_expert.vlm.model."
REQUIRED_FILES = {
    "config.json": "the VLM's configuration",
    "tokenizer.json": "its tokenizer",
    "tokenizer_config.json": "its tokenizer's settings (special tokens)",
    "preprocessor_config.json": "its image processor's settings",
}
# The special tokens SmolVLA's model reads from the tokenizer (transformers' SmolVLM processor).
SPECIAL_TOKENS = ("fake_image_token", "image_token", "global_image_token", "end_of_utterance_token")


@dataclass(frozen=True)
class VLMFolder:
    """A checked local copy of SmolVLA's VLM description."""

    path: Path
    name: str  # the checkpoint's vlm_model_name (the hub id it was trained from)
    config: dict[str, Any]
    pad_id: int
    vocab: int  # tokens the tokenizer knows (its added tokens included)


def _read(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"--vlm-dir {path.parent}: {path.name} ({what}) is not readable JSON ({exc})") from None


def default_vlm_dir(ckpt: Checkpoint) -> Path | None:
    """The checkpoint's ``vlm_model_name`` when it names a folder on this machine."""
    name = ckpt.config.get("vlm_model_name")
    return Path(name) if isinstance(name, str) and Path(name).is_dir() else None


def read_vlm_dir(path: str | Path | None, ckpt: Checkpoint) -> VLMFolder:
    """Check ``path`` against ``ckpt`` (a SmolVLA checkpoint); :class:`CheckpointError` otherwise."""
    name = str(ckpt.config.get("vlm_model_name") or "")
    if path is None:
        found = default_vlm_dir(ckpt)
        if found is None:
            raise CheckpointError(
                f"SmolVLA needs its vision-language model's folder: pass --vlm-dir DIR with {name or 'the VLM'}'s "
                "config.json and tokenizer files (docs/lerobot.md, 'SmolVLA')"
            )
        path = found
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"--vlm-dir {root}: no such folder (a local copy of {name}: docs/lerobot.md)")
    missing = [f"{f} ({what})" for f, what in REQUIRED_FILES.items() if not (root / f).is_file()]
    if missing:
        raise CheckpointError(
            f"--vlm-dir {root}: missing {', '.join(missing)}; copy them from {name} (docs/lerobot.md, 'SmolVLA')"
        )
    config = _read(root / "config.json", REQUIRED_FILES["config.json"])
    if not isinstance(config, dict) or config.get("model_type") != "smolvlm":
        got = config.get("model_type") if isinstance(config, dict) else None
        raise CheckpointError(f"--vlm-dir {root}: config.json describes a {got!r} model, SmolVLA needs 'smolvlm'")
    tok_cfg = _read(root / "tokenizer_config.json", REQUIRED_FILES["tokenizer_config.json"])
    pad_id, vocab = _tokenizer_ids(root, tok_cfg if isinstance(tok_cfg, dict) else {})
    _check_dims(root, config, vocab, ckpt)
    return VLMFolder(root, name or str(root), config, pad_id, vocab)


def _tokenizer_ids(root: Path, tok_cfg: dict[str, Any]) -> tuple[int, int]:
    """The pad token's id and the number of tokens, from ``tokenizer.json``; the special
    tokens SmolVLA reads must be there."""
    from tokenizers import Tokenizer

    try:
        tok = Tokenizer.from_file(str(root / "tokenizer.json"))
    except Exception as exc:  # tokenizers raises its own Exception type
        raise CheckpointError(f"--vlm-dir {root}: tokenizer.json is not a tokenizers file ({exc})") from None
    extra = tok_cfg.get("extra_special_tokens") or {}
    missing = [k for k in SPECIAL_TOKENS if not isinstance(extra, dict) or tok.token_to_id(str(extra.get(k))) is None]
    if missing:
        raise CheckpointError(
            f"--vlm-dir {root}: tokenizer_config.json names no {', '.join(missing)} known to tokenizer.json "
            "(extra_special_tokens); not a SmolVLM tokenizer"
        )
    pad = tok_cfg.get("pad_token")
    pad = pad.get("content") if isinstance(pad, dict) else pad
    pad_id = tok.token_to_id(pad) if isinstance(pad, str) else None
    if pad_id is None:
        raise CheckpointError(f"--vlm-dir {root}: tokenizer_config.json names no pad_token known to tokenizer.json")
    return int(pad_id), int(tok.get_vocab_size(with_added_tokens=True))


def _check_dims(root: Path, config: dict[str, Any], vocab: int, ckpt: Checkpoint) -> None:
    """The VLM configuration must describe the checkpoint's weights (one line: the first that differs)."""
    text = config.get("text_config") or {}
    vision = config.get("vision_config") or {}
    w = ckpt.weights

    def shape(key: str) -> tuple[int, ...] | None:
        entry = w.get(VLM_PREFIX + key)
        return entry[0] if entry else None

    embed = shape("text_model.embed_tokens.weight")
    patch = shape("vision_model.embeddings.patch_embedding.weight")
    positions = shape("vision_model.embeddings.position_embedding.weight")
    if embed is None or patch is None or positions is None:
        raise CheckpointError(f"{ckpt.path}/model.safetensors: no SmolVLM weights ({VLM_PREFIX}...); not SmolVLA")
    layers = 1 + max(
        (int(k[len(VLM_PREFIX) + len("text_model.layers.") :].split(".")[0]) for k in w if ".text_model.layers." in k),
        default=-1,
    )
    image, psize = vision.get("image_size"), vision.get("patch_size")
    grid = (image // psize) ** 2 if isinstance(image, int) and isinstance(psize, int) and psize > 0 else None
    checks = [
        ("text_config.hidden_size", text.get("hidden_size"), embed[1], "text width"),
        ("text_config.vocab_size", text.get("vocab_size"), embed[0], "vocabulary"),
        ("vision_config.hidden_size", vision.get("hidden_size"), patch[0], "vision width"),
        ("vision_config.patch_size", psize, patch[2], "patch size"),
        ("vision_config.image_size / patch_size squared", grid, positions[0], "image patches"),
    ]
    for key, got, want, what in checks:
        if got != want:
            raise CheckpointError(
                f"--vlm-dir {root}: config.json {key} is {got}, the checkpoint's weights have {want} ({what}): "
                f"not the VLM this checkpoint was trained from ({ckpt.config.get('vlm_model_name')})"
            )
    used = int(ckpt.config.get("num_vlm_layers") or 0)
    have = text.get("num_hidden_layers")
    if not isinstance(have, int) or have < layers or (used > 0 and have < used):
        raise CheckpointError(
            f"--vlm-dir {root}: config.json text_config.num_hidden_layers is {have}, the checkpoint's weights "
            f"have {layers} text layers: not the VLM this checkpoint was trained from"
        )
    if vocab > embed[0]:
        raise CheckpointError(
            f"--vlm-dir {root}: the tokenizer has {vocab} tokens, the checkpoint's embedding table {embed[0]}: "
            "not this checkpoint's tokenizer"
        )


def write_release_tokenizer(vlm: VLMFolder, path: Path) -> str:
    """The VLM's tokenizer with LeRobot's newline rule as a normalizer, saved at ``path``;
    returns its sha256."""
    from tokenizers import Regex, Tokenizer, normalizers

    tok = Tokenizer.from_file(str(vlm.path / "tokenizer.json"))
    newline = normalizers.Replace(Regex(r"\n?\z"), "\n")
    tok.normalizer = newline if tok.normalizer is None else normalizers.Sequence([newline, tok.normalizer])
    tok.save(str(path))
    return sha256_file(path)


def language_table(vlm: VLMFolder, sha256: str, max_tokens: int) -> dict[str, Any]:
    """The contract's ``[language]`` (without ``input``) for the release tokenizer at ``tokenizer.json``:
    LeRobot's padding (right, the pad token) and truncation (to ``tokenizer_max_length``)."""
    import importlib.metadata

    return {
        "tokenizer": vlm.name,
        "library": "tokenizers",
        "library_version": importlib.metadata.version("tokenizers"),
        "file": "tokenizer.json",
        "sha256": sha256,
        "max_tokens": max_tokens,
        "padding_side": "right",
        "pad_id": vlm.pad_id,
        "truncation": "truncate",
    }
