"""ONNX external data: what a model points to is judged by one check, in verify and at load.

Real ONNX models (built with the ``onnx`` package, read back by vlad's own wire-format walk)
inside small signed releases; the load is the real one (ONNX Runtime behind it).
"""

from __future__ import annotations

import datetime as dt
import random
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import make_keys, make_release
from vlad.cli import release as release_cli
from vlad.release.authoring import refresh_hashes, write_manifest
from vlad.release.external_data import external_data_refs
from vlad.release.loading import PolicySource, load_policy
from vlad.release.manifest import read_manifest_document
from vlad.release.signing import IntegrityError, sign_release, verify_release

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

WEIGHTS = np.ones((2, 2), np.float32)
OUTSIDE = "outside the release folder (a model's external data must be an artifact of its release)"


def _external(tensor, location: str) -> None:
    """``tensor``'s bytes moved to ``location`` (the file itself is the caller's)."""
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", "0"), ("length", str(WEIGHTS.nbytes))):
        entry = tensor.external_data.add()
        entry.key, entry.value = key, value


def _model(location: str):
    """y = x + w, w kept in ``location``."""
    w = numpy_helper.from_array(WEIGHTS, "w")
    _external(w, location)
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in ("x", "y")]
    graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", io[:1], io[1:], [w])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture()
def keys(tmp_path):
    return make_keys(tmp_path)


def _release(tmp_path: Path, private: Path, location: str, listed: str | None = None) -> Path:
    """A signed release valid today (vladctl verifies against the clock) whose policy.onnx
    keeps its weights in ``location``; ``listed``: a data file of the release beside it."""
    now = dt.datetime.now(dt.UTC)
    rel = make_release(
        tmp_path / "rel", None, not_before=now - dt.timedelta(days=1), expires=now + dt.timedelta(days=1)
    )
    (rel / "policy.onnx").write_bytes(_model(location).SerializeToString())
    doc = read_manifest_document(rel)
    if listed is not None:
        (rel / listed).write_bytes(WEIGHTS.tobytes())
        doc["artifacts"].append({"path": listed, "role": "weights", "size": 0, "sha256": ""})
    write_manifest(rel, refresh_hashes(doc, rel))
    sign_release(rel, private)
    return rel


@pytest.mark.parametrize(
    "location,problem",
    [
        ("../outside.bin", OUTSIDE),
        ("{outside}", OUTSIDE),  # absolute
        ("weights.bin", "which is not a listed artifact of the release (weights.bin)"),
    ],
    ids=["parent", "absolute", "unlisted"],
)
def test_verify_refuses_what_load_refuses_with_one_line(tmp_path, keys, capsys, location, problem):
    """A signed model pointing outside the release: `vladctl verify`, the load of the signed
    release and the load of the same folder used unsigned refuse it, each with the line
    naming the file and where it points."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(WEIGHTS.tobytes())  # what the model would read
    location = location.format(outside=outside)
    rel = _release(tmp_path, keys[0], location)
    named = f"policy.onnx: tensor 'w' keeps its data in {location!r}, {problem}"

    assert release_cli.main(["verify", str(rel), "--keys", str(keys[1])]) == 2
    err = capsys.readouterr().err
    assert err == f"error: release {rel.resolve()}: {named}\n", err
    with pytest.raises(IntegrityError) as signed:
        load_policy(PolicySource(rel, str(keys[1])), warmup=1)
    assert f"error: {signed.value}\n" == err
    # release.verify = false: no manifest, so "a file of the folder" instead of "listed"
    with pytest.raises(IntegrityError, match=r"policy.onnx: tensor 'w' keeps its data in ") as unsigned:
        load_policy(PolicySource(rel, None, backend="onnxruntime", artifact="policy.onnx"), warmup=1)
    assert "\n" not in str(unsigned.value) and repr(location) in str(unsigned.value)


def test_external_data_that_is_a_listed_artifact_verifies(tmp_path, keys):
    rel = _release(tmp_path, keys[0], "policy.onnx.data", listed="policy.onnx.data")
    assert external_data_refs(rel / "policy.onnx") == [("w", "policy.onnx.data")]
    v = verify_release(rel, keys[1])
    assert v.files["policy.onnx.data"].size == WEIGHTS.nbytes


def test_every_tensor_is_found_where_onnx_keeps_one(tmp_path):
    """Initializers, a Constant node's tensor, a control-flow subgraph's initializer, a
    sparse initializer, a function's node: each reference is read, in file order."""
    w = numpy_helper.from_array(WEIGHTS, "w")
    _external(w, "w.bin")
    c = numpy_helper.from_array(WEIGHTS, "c")
    _external(c, "c.bin")
    sw = numpy_helper.from_array(WEIGHTS, "sw")
    _external(sw, "sub/sw.bin")
    values = numpy_helper.from_array(np.ones(2, np.float32), "sv")
    _external(values, "sparse.bin")
    sparse = helper.make_sparse_tensor(values, numpy_helper.from_array(np.array([0, 3], np.int64), "si"), [2, 2])
    fc = numpy_helper.from_array(WEIGHTS, "fc")
    _external(fc, "function.bin")
    out = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 2])  # noqa: E731
    then_g = helper.make_graph([helper.make_node("Identity", ["sw"], ["t"])], "then", [], [out("t")], [sw])
    else_g = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [], [out("e")])
    nodes = [
        helper.make_node("Constant", [], ["k"], value=c),
        helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g),
        helper.make_node("Add", ["x", "w"], ["y"]),
    ]
    cond = numpy_helper.from_array(np.array(True), "cond")
    graph = helper.make_graph(nodes, "g", [out("x")], [out("y")], [w, cond], sparse_initializer=[sparse])
    function = helper.make_function("local", "F", [], ["o"], [helper.make_node("Constant", [], ["o"], value=fc)], [])
    model = helper.make_model(graph, functions=[function], opset_imports=[helper.make_opsetid("", 17)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    assert sorted(external_data_refs(tmp_path / "m.onnx")) == [
        ("c", "c.bin"),
        ("fc", "function.bin"),
        ("sv", "sparse.bin"),
        ("sw", "sub/sw.bin"),
        ("w", "w.bin"),
    ]


def test_anything_that_is_not_a_model_has_no_references_and_never_crashes(tmp_path, demo_dir):
    """The demo's model (weights inside it), random bytes, and a model cut or flipped at
    random places: a list (empty where the walk finds no model), never an exception."""
    assert external_data_refs(demo_dir / "policy.onnx") == []
    data = _model("w.bin").SerializeToString()
    rng = random.Random(33)
    path = tmp_path / "m.onnx"
    for _ in range(300):
        damaged = bytearray(data[: rng.randrange(len(data) + 1)])
        if damaged:
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        path.write_bytes(bytes(damaged))
        assert isinstance(external_data_refs(path), list)
    path.write_bytes(rng.randbytes(100_000))
    assert external_data_refs(path) == []
