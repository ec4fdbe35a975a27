"""Every backend's options table is total: each value a manifest or a config can hold is
parsed or refused with one :class:`BackendError` line naming the backend and the key, never
another exception, before any engine is touched.

Each backend declares its options as a frozen dataclass parsed by
:func:`vlad.backend.parse_options`; these tests drive every declared key of every backend
with hostile values (wrong types, NaN and infinities, huge and negative numbers, empty and
NUL strings, deep nesting), then random tables, then the rules each backend adds.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

import pytest

from vlad.backend import PRECISIONS
from vlad.errors import BackendError
from vlad.schema import MAX_DEPTH

CPU, CUDA, TRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


HOSTILE: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    -(2**70),
    float("nan"),
    float("inf"),
    -0.0,
    1e308,
    "",
    " ",
    "\x00",
    "a\nb",
    "x" * 10_000,
    "grpc://h:1",
    "fp32",
    [],
    [None],
    ["a", "a"],
    [[CUDA, {"device_id": "x"}]],
    _nested(MAX_DEPTH + 5),
    {},
    {"a": {"b": _nested(MAX_DEPTH + 5)}},
    {CPU: "not a table"},
]


def _parsers(contract) -> dict[str, tuple[type, Callable[[dict], Any], dict]]:
    """Backend name -> (its options dataclass, its parser, a minimal valid table)."""
    from vlad_kserve.options import RemoteOptions
    from vlad_kserve.options import parse_options as kserve_parse
    from vlad_onnxruntime.options import OrtOptions
    from vlad_tensorrt import TensorRTOptions
    from vlad_torch.session import TorchOptions

    return {
        "torch": (TorchOptions, lambda o: TorchOptions.parse("torch", o), {}),
        "tensorrt": (TensorRTOptions, TensorRTOptions.parse, {}),
        "onnxruntime": (OrtOptions, OrtOptions.parse, {}),
        "kserve": (RemoteOptions, lambda o: kserve_parse(o, contract), {"endpoint": "grpc://127.0.0.1:8001"}),
    }


BACKENDS = ["torch", "tensorrt", "onnxruntime", "kserve"]


def _keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")]


def _parse_or_refuse(backend: str, parse: Callable[[dict], Any], table: dict) -> Any:
    """The parsed options, or None after checking the refusal is one line naming the backend."""
    try:
        return parse(table)
    except BackendError as exc:
        text = str(exc)
        assert text.startswith(f"{backend}: "), text
        assert "\n" not in text and "\r" not in text, text
        assert len(text) < 4000, f"{len(text)} characters: {text[:200]}..."
        return None


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_key_takes_every_hostile_value_or_refuses_it_in_one_line(backend, contract):
    cls, parse, base = _parsers(contract)[backend]
    for key in _keys(cls):
        for value in HOSTILE:
            opts = _parse_or_refuse(backend, parse, {**base, key: value})
            if opts is None:
                continue
            # Accepted: the value was of the declared type, and it is what the backend holds.
            assert isinstance(opts, cls)


@pytest.mark.parametrize("backend", BACKENDS)
def test_random_tables_are_parsed_or_refused(backend, contract):
    cls, parse, base = _parsers(contract)[backend]
    rng = random.Random(f"options-{backend}")
    keys = [*_keys(cls), "token", "tf32", "options", "providers ", "Precision"]
    refused = 0
    for _ in range(300):
        table = dict(base) if rng.random() < 0.7 else {}
        for key in rng.sample(keys, rng.randint(1, 4)):
            table[key] = rng.choice(HOSTILE)
        refused += _parse_or_refuse(backend, parse, table) is None
    assert refused > 0  # the hostile values did reach the checks


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_unknown_key_is_refused_with_the_closest_known_one(backend, contract):
    cls, parse, base = _parsers(contract)[backend]
    key = _keys(cls)[0]
    with pytest.raises(BackendError, match=rf"options\.{key}x: unknown key \(did you mean '{key}'\?\)"):
        parse({**base, f"{key}x": 1})


@pytest.mark.parametrize("backend", BACKENDS)
def test_precision_is_one_of_the_shared_labels(backend, contract):
    cls, parse, base = _parsers(contract)[backend]
    assert parse(base).precision == "fp32"
    with pytest.raises(BackendError, match="options.precision"):
        parse({**base, "precision": "fp64"})
    for label in PRECISIONS:
        # Each label is either taken as it is or refused by the backend's own precision type.
        opts = _parse_or_refuse(backend, parse, {**base, "precision": label})
        assert opts is None or opts.precision == label


# ---------------------------------------------------------------------------------------
# ONNX Runtime: the provider list
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"providers": []}, r"options.providers: must name at least one execution provider"),
        ({"providers": [1]}, r"options.providers\[0\]: expected a provider name or \[name, \{options\}\], got 1"),
        ({"providers": [""]}, r"options.providers\[0\]: expected a provider name"),
        ({"providers": [[CUDA]]}, r"options.providers\[0\]: expected a provider name"),
        ({"providers": [[CUDA, "x"]]}, r"options.providers\[0\]: expected a provider name"),
        ({"providers": [[CUDA, {}, {}]]}, r"options.providers\[0\]: expected a provider name"),
        ({"providers": [CPU, CPU]}, r"options.providers\[1\]: provider CPUExecutionProvider is listed twice"),
        ({"provider_options": {CUDA: {}}}, r"options.provider_options.CUDAExecutionProvider: .* is not in providers"),
        ({"provider_options": {CPU: 3}}, r"options.provider_options.CPUExecutionProvider: expected a table"),
        ({"providers": [[CUDA, {"device_id": "gpu0"}]]}, r"device_id must be a GPU index .*'gpu0'"),
        ({"providers": [[CUDA, {"device_id": -1}]]}, r"device_id must be a GPU index .*'-1'"),
        ({"providers": [[CUDA, {"use_tf32": 1}]]}, r"use_tf32 is set by the backend"),
        ({"providers": [TRT], "provider_options": {TRT: {"trt_fp16_enable": 1}}}, r"trt_fp16_enable is set by"),
        ({"intra_op_threads": -1}, r"options.intra_op_threads: must be >= 0, got -1"),
        ({"intra_op_threads": 1.5}, r"options.intra_op_threads: expected an integer, got a float"),
        ({"memory_map": "yes"}, r"options.memory_map: expected true or false, got a string"),
        ({"check_node_placement": 0}, r"options.check_node_placement: expected true or false"),
        ({"cache_dir": ""}, r"options.cache_dir: must not be empty"),
        ({"optimized_model_path": "a\x00b"}, r"options.optimized_model_path: must not contain NUL"),
        ({"precision": "int8"}, r"options.precision: unknown value 'int8' \(known: fp32, tf32, fp16, bf16\)"),
    ],
)
def test_onnxruntime_bad_values_are_refused_before_a_session(options, message):
    from vlad_onnxruntime.options import OrtOptions

    with pytest.raises(BackendError, match=message) as info:
        OrtOptions.parse(options)
    assert str(info.value).startswith("onnxruntime: ") and "\n" not in str(info.value)


def test_onnxruntime_reports_every_problem_at_once(contract, tmp_path):
    pytest.importorskip("onnxruntime")
    from vlad_onnxruntime import OnnxRuntimeBackend

    # load() refuses before it looks at the artifact, which does not exist here.
    with pytest.raises(BackendError) as info:
        OnnxRuntimeBackend().load(
            tmp_path / "absent.onnx",
            contract,
            {"providers": [CPU, 7], "intra_op_threads": True, "graph_optimization_level": "max", "memmap": True},
        )
    msg = str(info.value)
    for part in (
        "options.providers[1]: expected a provider name",
        "options.intra_op_threads: expected an integer, got a boolean",
        "options.graph_optimization_level: unknown value 'max' (known: disable, basic, extended, all)",
        "options.memmap: unknown key (did you mean 'memory_map'?)",
    ):
        assert part in msg, msg
    assert "does not exist" not in msg


# ---------------------------------------------------------------------------------------
# KServe: endpoint, names, files, timeouts
# ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"endpoint": ""}, r"options.endpoint: must not be empty"),
        ({"endpoint": 8001}, r"options.endpoint: expected a string, got an integer"),
        ({"endpoint": "grpc://h:99999"}, r"the port is not a number \(1..65535\)"),
        ({"endpoint": "grpc://h:x"}, r"the port is not a number"),
        ({"endpoint": "grpc://:1"}, r"needs a host and a port"),
        ({"endpoint": "http://[::1:8000"}, r"options.endpoint: 'http://\[::1:8000': not a URL"),
        ({"endpoint": "grpc://h:1/v2"}, r"a path is not supported"),
        ({"endpoint": "grpc://h\n:1"}, r"must not contain spaces or control characters"),
        ({"endpoint": "grpc://h:1", "protocol": "ftp"}, r"options.protocol: unknown value 'ftp'"),
        ({"endpoint": "grpc://h:1", "model_name": "../admin"}, r"options.model_name: '../admin' is not a model name"),
        ({"endpoint": "grpc://h:1", "model_name": "m?x=1"}, r"options.model_name: .* is not a model name"),
        ({"endpoint": "grpc://h:1", "model_version": "1/infer"}, r"options.model_version: .* is not a model name"),
        ({"endpoint": "grpc://h:1", "model_name": ""}, r"options.model_name: must not be empty"),
        ({"endpoint": "grpc://h:1", "recover_after": 0}, r"options.recover_after: must be >= 1, got 0"),
        ({"endpoint": "grpc://h:1", "recover_after": 101}, r"options.recover_after: must be <= 100, got 101"),
        ({"endpoint": "grpc://h:1", "stats_window": 9}, r"options.stats_window: must be >= 10, got 9"),
        ({"endpoint": "grpc://h:1", "stats_window": 20.0}, r"options.stats_window: expected an integer, got a float"),
        ({"endpoint": "grpc://h:1", "timeout_ms": float("nan")}, r"options.timeout_ms: must be finite"),
        ({"endpoint": "grpc://h:1", "timeout_ms": 0}, r"options.timeout_ms: must be >= 0.1, got 0"),
        ({"endpoint": "grpc://h:1", "connect_timeout_ms": True}, r"connect_timeout_ms: expected a number, got a bool"),
        ({"endpoint": "grpc://h:1", "max_response_mb": 0}, r"options.max_response_mb: must be >= 0.001"),
        ({"endpoint": "grpc://h:1", "min_timeout_ms": 5, "max_timeout_ms": 2}, r"5 is above max_timeout_ms 2"),
        ({"endpoint": "grpc://h:1", "precision": "fp64"}, r"options.precision: unknown value 'fp64'"),
        ({"endpoint": "grpcs://h:1", "tls_cert_file": "/etc/hostname"}, r"needs both tls_cert_file and tls_key_file"),
        ({"endpoint": "grpc://h:1", "tls_ca_file": "/etc/hostname"}, r"TLS files are set but .* is plaintext"),
        ({"endpoint": "grpc://h:1", "token_file": "/"}, r"options.token_file: '/' does not exist or is not a file"),
        ({"endpoint": "grpc://h:1", "token": "secret"}, r"options.token: a bearer token must not be inline"),
    ],
)
def test_kserve_bad_values_are_refused_with_the_key(contract, options, message):
    from vlad_kserve.options import parse_options

    with pytest.raises(BackendError, match=message) as info:
        parse_options(options, contract)
    assert str(info.value).startswith("kserve: ") and "\n" not in str(info.value)


def test_kserve_reports_every_problem_at_once(contract):
    from vlad_kserve.options import parse_options

    with pytest.raises(BackendError) as info:
        parse_options({"timeout_ms": -1, "tls_ca_file": "/nonexistent", "token": "x", "stats_window": "big"}, contract)
    msg = str(info.value)
    for part in (
        "options.endpoint: required",
        "options.timeout_ms: must be >= 0.1",
        "options.tls_ca_file: '/nonexistent' does not exist",
        "options.token: a bearer token must not be inline",
        "options.stats_window: expected an integer, got a string",
    ):
        assert part in msg, msg


def test_kserve_empty_file_options_mean_none(contract):
    from vlad_kserve.options import parse_options

    opts = parse_options({"endpoint": "grpcs://h:1", "tls_ca_file": "", "token_file": ""}, contract)
    assert (opts.tls_ca_file, opts.token_file, opts.tls) == (None, None, True)
