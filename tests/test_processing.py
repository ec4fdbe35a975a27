"""The one pre/post-processing implementation, checked on golden fixtures and edge cases."""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest

from vlad.errors import ObservationError, TokenizerError
from vlad.processing import (
    RawObservation,
    Tokenizer,
    decode_actions,
    make_noise,
    normalize_actions,
    preprocess,
    preprocess_image,
    preprocess_proprio,
)

# -- golden fixtures: serving path and training path ---------------------------------------


def test_golden_serving_path(contract, tokenizer, golden):
    """preprocess() (what the daemon calls) reproduces the fixtures' model inputs exactly."""
    for case in golden:
        inputs = preprocess(contract, tokenizer, case["raw"])
        assert sorted(inputs) == sorted(case["inputs"])
        for name, expected in case["inputs"].items():
            assert inputs[name].dtype == expected.dtype, name
            np.testing.assert_array_equal(inputs[name], expected, err_msg=name)
        actions = decode_actions(contract, case["outputs"])
        np.testing.assert_array_equal(actions, case["actions"])


def test_golden_training_path(contract, tokenizer, golden):
    """The per-field functions the trainer calls build the same tensors as the serving path."""
    cam = contract.cameras[0]
    for case in golden:
        raw = case["raw"]
        np.testing.assert_array_equal(preprocess_image(cam, raw.images[cam.name])[None], case["inputs"][cam.input])
        np.testing.assert_array_equal(tokenizer.encode(raw.instruction)[None], case["inputs"][contract.language.input])
        np.testing.assert_array_equal(
            preprocess_proprio(contract, raw.proprio)[None], case["inputs"][contract.proprio.input]
        )
        np.testing.assert_array_equal(make_noise(contract, raw.sequence), case["inputs"][contract.noise.input])
        # the training target is the inverse of decoding
        np.testing.assert_allclose(
            normalize_actions(contract, case["actions"])[None], case["outputs"]["actions"], atol=1e-5
        )


# -- images ---------------------------------------------------------------------------------


def _camera(contract, **raw_model):
    cam = contract.cameras[0]
    raw = dataclasses.replace(cam.raw, **{k[4:]: v for k, v in raw_model.items() if k.startswith("raw_")})
    model = dataclasses.replace(cam.model, **{k[6:]: v for k, v in raw_model.items() if k.startswith("model_")})
    return dataclasses.replace(cam, raw=raw, model=model)


def _identity_norm(cam):
    return dataclasses.replace(
        cam, model=dataclasses.replace(cam.model, scale=1.0, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
    )


def test_bgr_raw_is_swapped_to_rgb(contract):
    cam = _identity_norm(_camera(contract, raw_color_order="BGR"))
    img = np.zeros((64, 64, 3), np.uint8)
    img[..., 0] = 200  # blue in BGR
    out = preprocess_image(cam, img)
    assert out.shape == (3, 64, 64)
    assert out[2].max() == 200 and out[0].max() == 0


def test_chw_raw_layout(contract):
    cam = _identity_norm(_camera(contract, raw_layout="CHW"))
    img = np.random.default_rng(0).integers(0, 255, (3, 64, 64), dtype=np.uint8)
    hwc = _identity_norm(contract.cameras[0])
    np.testing.assert_array_equal(preprocess_image(cam, img), preprocess_image(hwc, np.transpose(img, (1, 2, 0))))


def test_normalization(contract):
    cam = contract.cameras[0]
    img = np.full((64, 64, 3), 255, np.uint8)
    out = preprocess_image(cam, img)
    expected = (1.0 - np.asarray(cam.model.mean)) / np.asarray(cam.model.std)
    np.testing.assert_allclose(out[:, 0, 0], expected, rtol=1e-6)


@pytest.mark.parametrize("method", ["bilinear", "nearest", "area"])
def test_resize_downscale_of_constant_image(contract, method):
    cam = _identity_norm(_camera(contract, raw_height=128, raw_width=128, model_resize=method))
    out = preprocess_image(cam, np.full((128, 128, 3), 7, np.uint8))
    assert out.shape == (3, 64, 64)
    np.testing.assert_allclose(out, 7.0)


def test_bilinear_matches_half_pixel_convention(contract):
    """2x upscale of [0, 10]: half-pixel centres give 0, 2.5, 7.5, 10."""
    cam = _identity_norm(
        _camera(contract, raw_height=1, raw_width=2, model_height=1, model_width=4, model_resize="bilinear")
    )
    img = np.zeros((1, 2, 3), np.uint8)
    img[0, 1] = 10
    np.testing.assert_allclose(preprocess_image(cam, img)[0, 0], [0.0, 2.5, 7.5, 10.0])


def test_center_crop_keeps_the_middle(contract):
    cam = _identity_norm(_camera(contract, raw_height=64, raw_width=128, model_crop="center", model_resize="area"))
    img = np.zeros((64, 128, 3), np.uint8)
    img[:, 32:96] = 50  # the centred 64x64 window
    out = preprocess_image(cam, img)
    np.testing.assert_allclose(out, 50.0)


def test_resize_none_refuses_other_sizes(contract):
    cam = _camera(contract, raw_height=32, raw_width=32, model_resize="none")
    with pytest.raises(ObservationError, match="no resize"):
        preprocess_image(cam, np.zeros((32, 32, 3), np.uint8))


@pytest.mark.parametrize(
    "img",
    [np.zeros((64, 64, 3), np.float32), np.zeros((32, 64, 3), np.uint8), np.zeros((3, 64, 64), np.uint8), [[0]]],
    ids=["dtype", "height", "layout", "not-array"],
)
def test_bad_images_are_refused(contract, img):
    with pytest.raises(ObservationError, match="camera 'overhead'"):
        preprocess_image(contract.cameras[0], img)


def test_missing_camera(contract, tokenizer):
    with pytest.raises(ObservationError, match="no image from camera"):
        preprocess(contract, tokenizer, RawObservation(images={}, proprio=np.zeros(4, np.float32), instruction="x"))


# -- proprio and noise ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "p",
    [np.zeros(3, np.float32), np.zeros(4, np.int64), np.array([0, np.nan, 0, 0], np.float32), None],
    ids=["dim", "dtype", "nan", "missing"],
)
def test_bad_proprio_is_refused(contract, p):
    with pytest.raises(ObservationError):
        preprocess_proprio(contract, p)


def test_noise_is_reproducible_per_sequence(contract):
    a, b, c = make_noise(contract, 5), make_noise(contract, 5), make_noise(contract, 6)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.shape == (1, *contract.noise.shape) and a.dtype == np.float32
    zeros = dataclasses.replace(contract, noise=dataclasses.replace(contract.noise, seeding="zeros"))
    assert not make_noise(zeros, 5).any()


def test_noise_drawn_ahead_is_the_noise_of_that_observation(contract, tokenizer, golden):
    """The serving loop draws the next observation's noise between two (Preprocessor.prepare):
    an observation whose number it guessed gets exactly that noise, any other its own."""
    from vlad.processing import Preprocessor

    pre = Preprocessor(contract, tokenizer)
    name = contract.noise.input
    for case in golden:
        raw = case["raw"]
        for guess in (raw.sequence, raw.sequence - 1, raw.sequence + 1):
            pre.prepare(guess)
            np.testing.assert_array_equal(pre.fill(raw)[name], make_noise(contract, raw.sequence), err_msg=str(guess))


# -- tokenizer -----------------------------------------------------------------------------


def test_tokenizer_pads_right_with_pad_id(contract, tokenizer):
    ids = tokenizer.encode("reach the red target")
    assert ids.dtype == np.int64 and ids.shape == (contract.language.max_tokens,)
    assert (ids[:4] > 1).all() and (ids[4:] == contract.language.pad_id).all()
    # the normalizer lowercases
    np.testing.assert_array_equal(tokenizer.encode("Reach the RED target"), ids)


def test_tokenizer_left_padding_and_truncation(contract):
    spec = dataclasses.replace(contract.language, padding_side="left", truncation="truncate", max_tokens=3)
    tok = Tokenizer.from_contract(dataclasses.replace(contract, language=spec))
    ids = tok.encode("reach the point opposite the red target")
    assert ids.shape == (3,) and (ids > 1).all()
    left = Tokenizer.from_contract(dataclasses.replace(contract, language=dataclasses.replace(spec, max_tokens=6)))
    assert list(left.encode("reach")[:5]) == [spec.pad_id] * 5


def test_too_long_instruction_is_an_error(tokenizer):
    with pytest.raises(TokenizerError, match="tokens"):
        tokenizer.encode("reach the point opposite the red target and then the point opposite again")


def test_tokenizer_file_is_pinned_by_sha256(contract, tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(contract.tokenizer_path.read_bytes().replace(b'"red"', b'"blue"'))
    assert hashlib.sha256(path.read_bytes()).hexdigest() != contract.language.sha256
    spec = dataclasses.replace(contract.language, file=str(path))
    with pytest.raises(TokenizerError, match="sha256"):
        Tokenizer.from_contract(dataclasses.replace(contract, language=spec))


# -- decoding ------------------------------------------------------------------------------


def test_decode_unnormalizes_per_joint(contract):
    y = np.zeros((1, contract.action.chunk_length, contract.action.dim), np.float32)
    y[..., 1] = 1.0
    a = decode_actions(contract, {"actions": y})
    j0, j1 = contract.action.joints
    np.testing.assert_allclose(a[:, 0], j0.mean * contract.action.scale, rtol=1e-6)
    np.testing.assert_allclose(a[:, 1], (j1.mean + j1.std) * contract.action.scale, rtol=1e-6)


def test_decode_refuses_wrong_shape(contract):
    with pytest.raises(ObservationError, match="expected"):
        decode_actions(contract, {"actions": np.zeros((1, 4, 2), np.float32)})


def test_preallocated_preprocessing_matches_the_reference_as_instructions_change(contract, tokenizer, golden):
    """Preprocessor.fill (the serving thread's) equals preprocess() case after case, also
    when the instruction changes and comes back (the token buffer is written only on a
    change)."""
    from vlad.processing import Preprocessor

    pre = Preprocessor(contract, tokenizer)
    cases = [*golden, *reversed(golden), *golden]
    raws = [c["raw"] for c in cases]
    raws += [dataclasses.replace(r, instruction=i) for r in raws[:2] for i in ("go left", "reach the red target")]
    assert len({r.instruction for r in raws}) > 1
    for raw in raws:
        got = pre.fill(raw)
        want = preprocess(contract, tokenizer, raw)
        for name, expected in want.items():
            np.testing.assert_array_equal(got[name], expected, err_msg=name)
