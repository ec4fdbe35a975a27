"""Planner inputs and outputs: files, overrides, placements, feasibility for gates."""

from __future__ import annotations

import json
import os

import pytest

from vlad_tools import planner
from vlad_tools.planner.execution import async_threshold, chunk_rate
from vlad_tools.planner.spec import PlannerError, PlannerFileError


def test_builtin_data_loads_with_sources():
    hardware = planner.load_hardware_file()
    assert {"jetson-thor", "jetson-agx-orin-64gb", "rtx-4090", "a100", "h100", "h200", "b100"} <= set(hardware)
    assert all(h.source for h in hardware.values())
    networks = planner.load_network_file()
    assert {"ethernet-1g", "ethernet-10g", "wifi-6", "wifi-7", "4g", "5g", "slow-cloud", "fast-cloud"} <= set(networks)
    assert all(n.source for n in networks.values())
    assert planner.load_hardware("RTX 4090").key == "rtx-4090"
    assert planner.load_model("vlad-demo-reacher").name == "vlad-demo"  # by contract model.id


def test_unknown_names_and_missing_precision_are_one_line_errors():
    with pytest.raises(PlannerError, match="unknown hardware 'tpu'; known: jetson-thor"):
        planner.load_hardware("tpu")
    with pytest.raises(PlannerError, match="unknown model"):
        planner.load_model("gpt-9")
    with pytest.raises(PlannerError, match="has no fp8 peak"):
        planner.predict("pi0", "jetson-agx-orin-64gb", precision="fp8")
    with pytest.raises(PlannerError, match="needs a network"):
        planner.predict("pi0", "b100", placement="edge")
    with pytest.raises(PlannerError, match="uses no network"):
        planner.predict("pi0", "b100", network="wifi-7")


def test_a_broken_model_file_lists_every_problem(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text(
        '[model]\nname = "x"\nprecision = "fp7"\n[vision]\nkind = "vit"\ncameras = 0\n'
        '[backbone]\nlayers = 2\n[action]\nkind = "flow"\nbogus = 1\n'
    )
    with pytest.raises(PlannerFileError) as exc:
        planner.load_model(f)
    msg = str(exc.value)
    for part in (
        "model.precision",
        "vision.cameras: must be > 0",
        "backbone.hidden: missing",
        "action.bogus: unknown key",
    ):
        assert part in msg
    assert "\n" not in msg


def test_conv_layers_are_checked_inside_their_array():
    import tomllib

    doc = tomllib.loads((planner.spec.DATA / "models" / "vlad-demo.toml").read_text())
    doc["vision"]["conv"][1].update(kernel=0, padding=-1)
    with pytest.raises(PlannerFileError) as exc:
        planner.spec.parse_model(doc, "demo")
    assert sorted(exc.value.problems) == [
        "vision.conv[1].kernel: must be > 0, got 0",
        "vision.conv[1].padding: must be >= 0, got -1",
    ]
    doc["vision"]["conv"] = []
    with pytest.raises(PlannerFileError, match=r"vision.conv: a conv encoder needs at least one \[\[vision.conv\]\]"):
        planner.spec.parse_model(doc, "demo")


def test_a_data_file_that_is_not_a_plain_toml_file_is_a_one_line_error(tmp_path):
    fifo, bomb = tmp_path / "fifo.toml", tmp_path / "bomb.toml"
    os.mkfifo(fifo)  # reading it would wait for a writer forever
    bomb.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")  # tomllib would overflow the stack
    for load in (planner.load_model, planner.load_hardware_file, planner.load_network_file):
        for path, why in ((fifo, "not a regular file"), (bomb, "nested deeper than")):
            with pytest.raises(PlannerError, match=why):
                load(path)


@pytest.mark.parametrize(
    "load, text, problems",
    [
        (
            planner.load_hardware_file,
            "[conventions]\nbytes_per_gb = 0\n"
            "[gpu]\ntflops = { fp16 = 1 }\nmemory_gb = 1\nbandwidth_gb_s = -1\nbandwith = 2\n"
            '[tpu]\ntflops = { fp7 = 1, fp16 = 0, bf16 = "x" }\nmemory_gb = 8\nbandwidth_gb_s = 100\n'
            "[npu]\ntflops = {}\nmemory_gb = 8\nbandwidth_gb_s = 100\n",
            [
                "conventions.bytes_per_gb: must be > 0, got 0.0",
                "gpu.bandwidth_gb_s: must be > 0, got -1.0",
                "gpu.bandwith: unknown key (did you mean 'bandwidth_gb_s'?)",
                "npu.tflops: no compute peak given",
                "tpu.tflops.bf16: expected a number, got a string",
                "tpu.tflops.fp16: must be > 0, got 0",
                "tpu.tflops.fp7: unknown precision (known: fp32, tf32, bf16, fp16, fp8, int8, fp4, int4)",
            ],
        ),
        (
            planner.load_network_file,
            "[conventions]\njpeg_ratio = 0\n[lan]\nupload_mbps = 0\ndownload_mbps = true\nlatency_ms = -1\n",
            [
                "conventions.jpeg_ratio: must be > 0, got 0.0",
                "lan.download_mbps: expected a number, got a boolean",
                "lan.latency_ms: must be >= 0, got -1.0",
                "lan.upload_mbps: must be > 0, got 0.0",
            ],
        ),
    ],
    ids=["hardware", "networks"],
)
def test_broken_hardware_and_network_files_list_every_problem(tmp_path, load, text, problems):
    f = tmp_path / "data.toml"
    f.write_text(text)
    with pytest.raises(PlannerFileError) as exc:
        load(f)
    assert sorted(exc.value.problems) == problems


def test_overrides_and_sweeps_move_the_right_component():
    base = planner.predict("pi0", "rtx-4090")
    more_steps = planner.predict("pi0", "rtx-4090", steps=20)
    assert more_steps.components["action"].ms == pytest.approx(2 * base.components["action"].ms)
    assert more_steps.components["vision"].ms == base.components["vision"].ms
    one_cam = planner.predict("pi0", "rtx-4090", cameras=1)
    assert one_cam.components["vision"].ms == pytest.approx(base.components["vision"].ms / 3)
    assert one_cam.model.prefix_tokens == 256 + 32
    bigger = planner.predict(planner.load_model("pi0").scaled(2.0), "rtx-4090")
    assert bigger.components["backbone"].ms > 3 * base.components["backbone"].ms
    fp8 = planner.predict("pi0", "h100", precision="fp8")
    assert fp8.compute_ms < planner.predict("pi0", "h100").compute_ms


def test_host_copies_and_memory_fit():
    p = planner.predict("pi0", "rtx-4090")
    assert 0 < p.host["h2d"] < 0.1  # 3 bf16 frames over PCIe 4.0 x16
    assert planner.predict("pi0", "jetson-thor").host == {"h2d": 0.0, "d2h": 0.0}  # unified memory
    assert p.fits and p.memory["weights"] > 5e9
    huge = planner.load_model("pi0").scaled(4.0)
    assert not planner.predict(huge, "rtx-4090").fits


def test_autoregressive_head(tmp_path):
    text = (
        planner.builtin_models()["pi0"].read_text().split("[action]")[0]
        + '[action]\nkind = "autoregressive"\nchunk = 1\ndof = 7\nvocab = 256\n'
    )
    f = tmp_path / "ar.toml"
    f.write_text(text)
    p = planner.predict(planner.load_model(f), "rtx-4090")
    assert p.components["action"].bound == "memory"  # one token at a time: weights dominate
    # 7 decode steps each read the whole backbone once: about 7 x 3.96 GB / 1008 GB/s
    assert 7 * 3.5 < p.components["action"].ms < 7 * 4.5


def test_feasibility_for_gates(contract):
    ok = planner.feasibility(contract, "vlad-demo-reacher", "jetson-thor")
    json.dumps(ok)  # JSON-able, as a gate report needs
    assert ok["meets_deadline"] and ok["meets_period"] and not ok["flagged"]
    assert ok["inputs"]["chunk"] == contract.action.chunk_length and ok["e2e_deadline_ms"] == 20.0
    late = planner.feasibility(contract, "vlad-demo", "jetson-thor", measured_e2e_ms=25.0)
    assert late["flagged"] and "measured e2e 25.00 ms exceeds the 20 ms deadline" in late["reasons"][0]
    remote = planner.feasibility(contract, "pi0", "b100", placement="cloud", network="4g,slow-cloud")
    assert remote["flagged"] and not remote["meets_deadline"]
    assert remote["inputs"]["payload"]["image_bytes"] == int(64 * 64 * 3 * 0.1)  # the contract's raw frame


def test_chunk_rate_model():
    """Chunk 8 x 20 ms, valid 160 ms, 4 waypoints per chunk (the figures scripts/bench_async.py measures)."""
    rate = lambda lat, mode, **kw: chunk_rate(lat, 20, 8, mode=mode, execute=4, validity_ms=160, **kw)  # noqa: E731
    assert rate(8, "sync").control_hz == rate(8, "async").control_hz == pytest.approx(50.0)
    assert async_threshold(8, 20, 8, 4, 160) == 3  # replan every 4 waypoints, like sync
    sync70 = rate(72, "sync")  # holds 3 ticks, executes 4
    assert (sync70.cycle_ticks, sync70.executed) == (7, 4) and sync70.control_hz == pytest.approx(200 / 7)
    assert rate(72, "async").control_hz == pytest.approx(50.0)  # 4 ticks late: half the horizon, hidden
    assert async_threshold(88, 20, 8, 4, 160) == 2
    late = rate(88, "async")  # 5 ticks late: 3 of every 5 ticks run, 2 idle
    assert (late.cycle_ticks, late.idle_ticks) == (5, 2) and late.control_hz == pytest.approx(30.0)
    assert rate(103, "sync").executed == 3 and rate(103, "sync").control_hz == pytest.approx(18.75)
    assert rate(103, "async").control_hz == pytest.approx(50 / 3)  # tail waypoints only: sync wins here
    assert rate(88, "async", threshold=4).idle_ticks == 2  # a later request cannot help either
    assert rate(170, "async").control_hz == 0.0 and rate(170, "sync").control_hz == 0.0
    # The runner's default rule: within the tick's wait nothing is lost; beyond it, it keeps
    # executing the current chunk and takes the late one at its age.
    assert rate(15, "wait").control_hz == pytest.approx(50.0) and rate(72, "wait").control_hz == pytest.approx(50.0)
    assert (rate(88, "wait").cycle_ticks, rate(88, "wait").idle_ticks) == (5, 2)
    assert rate(103, "wait").control_hz == pytest.approx(50 * 2 / 6) and rate(170, "wait").control_hz == 0.0


def test_a_component_table_takes_the_keys_of_its_kind():
    import tomllib

    doc = tomllib.loads((planner.spec.DATA / "models" / "vlad-demo.toml").read_text())
    doc["vision"]["layers"] = 2  # a conv encoder has no transformer stack
    del doc["action"]["steps"]  # a flow head needs its steps
    doc["measure"]["head"] = ["x"]
    with pytest.raises(PlannerFileError) as exc:
        planner.spec.parse_model(doc, "demo")
    assert sorted(exc.value.problems) == [
        "action.steps: missing",
        "measure.head: unknown key (known: vision, backbone, action)",
        "vision.layers: unknown key for kind = 'conv' (it takes: in_channels, conv)",
    ]
    doc = tomllib.loads((planner.spec.DATA / "models" / "pi0.toml").read_text())
    doc["action"] = {"kind": "autoregressive", "chunk": 8, "dof": 2, "steps": 4}
    del doc["backbone"]["heads"]
    with pytest.raises(PlannerFileError) as exc:
        planner.spec.parse_model(doc, "pi0")
    assert sorted(exc.value.problems) == [
        "action.steps: unknown key for kind = 'autoregressive' (it takes: tokens, vocab)",
        "backbone.heads: missing",
    ]


def test_the_file_units_and_their_si_values():
    hw = planner.load_hardware("rtx-4090")
    assert hw.tflops["bf16"] == 165 and hw.peak("fp16") == 165e12 == hw.peak_flops["bf16"]
    assert hw.memory_bytes == 24 * 2**30 and hw.memory_bandwidth == 1008 * 2**30
    assert hw.onchip_bandwidth == 18000 * 2**30 and hw.host_link_bandwidth == 31.5 * 2**30
    assert planner.load_hardware("jetson-thor").host_link_bandwidth is None
    model = planner.load_model("pi0")
    assert model.vision.transformer is not None and model.vision.transformer.head_dim == 72
    wider = model.scaled(2.0)
    assert wider.backbone.transformer.hidden == 4096 and wider.backbone.head_dim == 256  # head size kept
