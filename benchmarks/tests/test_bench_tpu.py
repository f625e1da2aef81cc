"""``bench_tpu`` on the CPU: ``--quick`` writes every part, a row at a time, and the
renderer reports what was measured against its targets, a row not measured as "not run"."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from benchmarks import bench_tpu as bt

import dropmask
from dropmask import testing

ENVIRONMENT = {
    "date_utc": "2026-01-01T00:00:00Z",
    "cpu_model": "test",
    "cpu_count": 1,
    "cpus_usable": 1,
    "load_average_at_start": [0.0, 0.0, 0.0],
    "device": "tpu: test",
    "jax": "0",
    "jaxlib": "0",
    "flax": "0",
    "equinox": "0",
    "haiku": "0",
    "optax": "0",
    "dropmask": "0",
    "git_commit": "abc",
    "python": "3",
    "xla_flags": "",
    "command": "python -m benchmarks.bench_tpu",
}


def _per_call(default_ms: float) -> list[dict[str, Any]]:
    rows = []
    for dtype in bt.DTYPES:
        times = {bt.X_C: 1.0, bt.DEFAULT: default_ms, bt.XLA_ROW: 3.0}
        times.update(dict.fromkeys(bt.FLAX_ROWS, 2.0))
        for name, ms in times.items():
            row = {"dtype": dtype, "name": name, "forward_ms": ms, "fwd_bwd_ms": ms}
            row.update(dispatch_forward_ms=ms + 0.5, dispatch_fwd_bwd_ms=ms + 1.0)
            if name == bt.DEFAULT:
                row["path"] = bt.KERNEL
            rows.append(row)
    return rows


def _step(swapped_ratio: float, swapped_compile_s: float) -> list[dict[str, Any]]:
    def row(name: str, compile_s: float, ratio: float | None) -> dict[str, Any]:
        out = {"dtype": "bfloat16", "name": name, "compile_s": compile_s, "temp_mib": 100.0}
        out["step_ms"] = 50.0 if ratio is None else 50.0 * ratio
        if ratio is not None:
            out.update(baseline_ms=50.0, ratio=ratio)
        return out

    return [
        row(bt.NO_DROPOUT, 10.0, None),
        {**row(bt.SWAPPED_RESIDUAL, swapped_compile_s, swapped_ratio), "path": bt.KERNEL},
        {**row(bt.SWAPPED_ALL, 22.0, 1.08), "path": bt.KERNEL, "attention_path": "TPU kernels"},
        {
            **row(bt.SWAPPED_ATTENTION_PATH, 21.0, 1.06),
            "path": bt.KERNEL,
            "attention_path": "TPU kernels",
        },
        {**row(bt.SWAPPED_FULL, 20.0, 2.1), "path": bt.KERNEL},
        row(bt.FLAX_ATTENTION, 25.0, 1.99),
        row(bt.FLAX_RESIDUAL, 90.0, 1.57),
        row(bt.FLAX_FULL, 95.0, 2.3),
    ]


def _attention(ours_ms: float) -> list[dict[str, Any]]:
    rows = []
    for length in bt.ATTENTION_LENGTHS:
        rows.append(
            {"length": length, "name": bt.AUTO, "path": "TPU kernels", "temp_mib": 1.0}
            | {"fwd_bwd_ms": ours_ms * length / 4096}
        )
        rows.append(
            {
                "length": length,
                "name": bt.JAX_FLASH,
                "temp_mib": 0.0,
                "fwd_bwd_ms": 6.0 * length / 4096,
            }
        )
        if length <= bt.DENSE_MAX:
            rows.append(
                {
                    "length": length,
                    "name": bt.FLAX_DENSE,
                    "temp_mib": 1000.0,
                    "fwd_bwd_ms": 5.0 * length / 4096,
                }
            )
    return rows


def _payload(
    default_ms: float = 1.2,
    swapped_ratio: float = 1.05,
    swapped_compile_s: float = 12.0,
    attention_ms: float = 4.5,
):
    return {
        "environment": ENVIRONMENT,
        "default_path": bt.KERNEL,
        "per_call_shape": [8192, 8192],
        "step_size": bt.STEP,
        "step_dtypes": ["bfloat16"],
        "checks": {"case a": {"default": True, "kernel": False, "XLA": True}},
        "per_call": _per_call(default_ms),
        "step": _step(swapped_ratio, swapped_compile_s),
        "attention": _attention(attention_ms),
        "notes": ["a note"],
    }


def _targets(md: str) -> dict[str, str]:
    """The targets' table: target -> verdict."""
    table = md.split("Targets:")[1].split("Per call at")[0]
    rows = [line.split(" | ") for line in table.splitlines() if line.startswith("| ")]
    return {cells[0][2:]: cells[-1].rstrip(" |") for cells in rows[1:]}


def test_targets_are_met_or_missed_by_the_measured_ratio():
    met = bt.render(_payload())
    assert "| float32 | dropmask default (TPU kernel) | 1.200 | 1.20 | 0.60 |" in met
    assert "| float32 | dropmask XLA path, tpu_kernels(False) | 3.000 | 3.00 | 1.50 |" in met
    targets = _targets(met)
    assert len(targets) == 6 + 3 + 7 + 1  # per call, step, attention, mesh (not run)
    assert set(targets.values()) == {"met", "not run"}
    missed = _targets(
        bt.render(
            _payload(default_ms=1.4, swapped_ratio=1.2, swapped_compile_s=40, attention_ms=5.5)
        )
    )
    assert missed["float32 per call, dropmask default (TPU kernel): forward / x * c <= 1.25x"] == (
        "missed"
    )
    assert missed["bfloat16 per call, dropmask default (TPU kernel): fwd+bwd / x * c <= 1.5x"] == (
        "met"
    )
    step = "bfloat16 step: swapped residual-only / no dropout <= 1.1x"
    compile_ = (
        "bfloat16 step: compile time added, swapped residual-only / flax residual-only <= 0.25"
    )
    assert (missed[step], missed[compile_]) == ("missed", "missed")
    assert "| bfloat16 step: compile time added, swapped residual-only / flax residual-only " in met
    assert "| 0.025 | met |" in met  # (12 - 10) / (90 - 10)
    # 5.5 ms at 4096 tokens: 0.92x JAX's kernel, 1.1x Flax's dense attention.
    jax_flash = f"attention, 4096 tokens: time / {bt.JAX_FLASH} <= 1.3x"
    flax = f"attention, 4096 tokens: time / {bt.FLAX_DENSE} <= 1.0x"
    assert (missed[jax_flash], missed[flax]) == ("met", "missed")
    assert f"| 4096 | {bt.AUTO} (TPU kernels) | 4.50 | 1.00 | 1.0 |" in met


def test_checks_steps_the_attention_share_and_notes_are_reported():
    md = bt.render(_payload())
    assert "Checks (default path): 1 of 1 outputs equal" in md
    assert (
        "Checks (TPU kernel, tpu_kernels()): 0 of 1 outputs equal a CPU process's bit for bit; "
        "differ: case a" in md
    )
    assert "Checks (XLA path, tpu_kernels(False)): 1 of 1 outputs equal" in md
    assert (
        "| bfloat16 | swapped residual-only (TPU kernel) | 52.5 | 1.050 | 100 | 12.0 | 2.0 |" in md
    )
    assert "Flax's attention-weight dropout stays in the model" in md
    assert "(flax attention-only) takes 1.99x (bfloat16) the step without dropout" in md
    assert "a note" in md


def test_a_run_without_its_step_part_renders_the_step_as_not_run():
    payload = _payload()
    del payload["step"]
    payload["step_error"] = "Traceback ...\nRuntimeError: out of time"
    del payload["per_call"][1]  # float32's dropmask default
    md = bt.render(payload)
    targets = _targets(md)
    assert [v for k, v in targets.items() if "step" in k] == ["not run"] * 3
    assert [v for k, v in targets.items() if k.startswith("float32")] == ["not run"] * 3
    assert [v for k, v in targets.items() if k.startswith("bfloat16 per")] == ["met"] * 3
    assert "| float32 | dropmask default | not run |" in md
    for name in bt.STEP_ROWS:
        assert f"| bfloat16 | {name} | not run |" in md
    assert "takes not run (bfloat16) the step" in md
    assert "step_error: `RuntimeError: out of time`" in md


def test_render_writes_the_tpu_section_and_refuses_an_unreadable_file(
    tmp_path, monkeypatch, capsys
):
    written = []
    monkeypatch.setattr(bt, "write_section", lambda *args: written.append(args))
    payload = _payload()
    del payload["step"]
    path = tmp_path / "tpu_results.json"
    path.write_text(json.dumps(payload))
    assert bt.main(["--render", str(path)]) == 0
    ((results, section, body),) = written
    assert (results.name, section) == ("RESULTS.md", "tpu")
    assert "| bfloat16 | no dropout | not run |" in body
    with pytest.raises(SystemExit) as err:
        bt.main(["--render", str(tmp_path / "missing.json")])
    assert err.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_several_runs_render_each_part_from_the_last_run_that_ran_it():
    first = _payload(swapped_ratio=1.3)  # every part, step missed
    second = {
        "environment": {**ENVIRONMENT, "git_commit": "def"},
        "parts": ["step"],
        "step": _step(1.05, 12.0),
        "step_dtypes": ["bfloat16"],
        "step_size": bt.STEP,
    }
    third = {"environment": {**ENVIRONMENT, "git_commit": "ghi"}, "parts": ["checks"]}
    third["checks_error"] = "Traceback ...\nRuntimeError: no CPU"
    result = bt.merged([first, second, third])
    assert [(r["environment"]["git_commit"], r["parts"]) for r in result["runs"]] == [
        ("abc", ["per_call", "attention"]),
        ("def", ["step"]),
        ("ghi", ["checks"]),
    ]
    assert "checks" not in result and result["notes"] == ["a note"]
    md = bt.render(result)
    assert _targets(md)["bfloat16 step: swapped residual-only / no dropout <= 1.1x"] == "met"
    assert "Run of parts step:" in md and "@ def" in md
    assert "checks_error: `RuntimeError: no CPU`" in md
    # A merged file merges again as its runs.
    assert bt.merged([result]) == result


@pytest.mark.parametrize("value", ["", "checks,gpu"])
def test_parts_refuses_a_part_it_does_not_know_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as err:
        bt.main(["--quick", "--parts", value])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "--parts: expected some of checks, per_call, attention, step" in lines[0]


@pytest.mark.parametrize("value", ["float64", "", "bfloat16,f32"])
def test_step_dtypes_refuses_a_dtype_it_does_not_time_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as err:
        bt.main(["--quick", "--step-dtypes", value])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "--step-dtypes: expected float32 and/or bfloat16 separated by commas" in lines[0]


def test_step_dtypes_takes_a_comma_list_once_each():
    assert bt._dtypes("bfloat16,float32,bfloat16") == ("bfloat16", "float32")


def test_rows_say_what_drew_the_mask():
    assert bt.drawn_by() == bt.XLA  # the CPU's default
    with testing.tpu_kernels():
        assert bt.drawn_by() == bt.KERNEL
        assert bt.drawn_by(differentiated=True) == bt.BYTES
    with testing.tpu_kernels(False):
        assert bt.drawn_by() == bt.XLA
        assert bt.drawn_by(differentiated=True) == bt.XLA


def test_quick_saves_each_row_and_reports_a_part_that_fails(tmp_path, monkeypatch):
    saved: list[list[str]] = []

    def step_rows(*args: Any) -> Any:
        yield {"dtype": "bfloat16", "name": bt.NO_DROPOUT, "compile_s": 1.0, "temp_mib": 1.0}
        saved.append(json.loads((tmp_path / "tpu_results.json").read_text())["step"])
        raise RuntimeError("out of time")

    monkeypatch.setattr(bt, "checks", lambda out: {"case a": {"default": True}})
    monkeypatch.setattr(bt, "QUICK_SHAPE", (32, 256))
    monkeypatch.setattr(bt, "DISPATCHES", 1)
    monkeypatch.setattr(bt, "step_rows", step_rows)
    monkeypatch.setattr(bt, "attention_rows", lambda *args: iter(()))
    assert bt.main(["--quick", "--out", str(tmp_path), "--parts", "checks,per_call,step"]) == 0
    result = json.loads((tmp_path / "tpu_results.json").read_text())
    assert saved == [
        [{"dtype": "bfloat16", "name": "no dropout", "compile_s": 1.0, "temp_mib": 1.0}]
    ]
    assert result["step"] == saved[0]
    assert result["step_error"].strip().endswith("RuntimeError: out of time")
    assert result["parts"] == ["checks", "per_call", "step"] and "attention" not in result
    assert (result["default_path"], result["step_dtypes"]) == (bt.XLA, ["bfloat16"])
    names = [(r["dtype"], r["name"], r.get("path")) for r in result["per_call"]]
    assert names == [
        (dtype, name, bt.XLA if name == bt.DEFAULT else None)
        for dtype in bt.DTYPES
        for name in bt.PER_CALL_ROWS
    ]
    timed = ("forward_ms", "fwd_bwd_ms", "dispatch_forward_ms", "dispatch_fwd_bwd_ms")
    assert all(isinstance(r[k], float) for r in result["per_call"] for k in timed)


@pytest.mark.slow  # about 5 min on 2 cores: every part at --quick size, the CPU checks too
def test_quick_runs_every_part_and_renders_it(tmp_path: Path, monkeypatch):
    assert bt.main(["--quick", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "tpu_results.json").read_text())
    assert not [k for k in result if k.endswith("_error")]
    assert all(
        v == {"default": True, "kernel": True, "XLA": True} for v in result["checks"].values()
    )
    assert len(result["checks"]) == len(bt._check_cases())
    assert [r["name"] for r in result["step"]] == list(bt.STEP_ROWS)
    assert all("ratio" in r for r in result["step"][1:])
    assert [(r["model"], r["name"]) for r in result["models"]] == [
        (model, name) for model in bt.QUICK_MODEL_SHAPES for name in bt.MODEL_ROWS.values()
    ]
    # Off a TPU the short part has no kernels row: auto, dense and Flax's per length.
    assert [(r["length"], r["name"]) for r in result["short"]] == [
        (length, name)
        for length in bt.QUICK_SHORT_LENGTHS["bfloat16"]
        for name in (bt.SHORT_AUTO, bt.SHORT_DENSE, bt.FLAX_DENSE)
    ]
    # The mesh part: attention, then the steps it names, each also over a one-device mesh,
    # at the step's size and at each model shape.
    mesh = result["mesh"]
    steps = len(bt.MESH_STEP_ROWS) * (1 + len(bt.QUICK_MODEL_SHAPES))
    assert [r["kind"] for r in mesh] == ["attention"] + ["step"] * steps
    assert [r["name"] for r in mesh[1:]] == list(bt.MESH_STEP_ROWS) * (steps // 2)
    assert [r.get("model") for r in mesh[1:]] == [None, None, *["ViT-like"] * (steps - 2)]
    assert mesh[0]["path"] == mesh[0]["mesh_path"]
    assert all(isinstance(r["mesh_ratio"], float) for r in mesh[1:])
    assert [r["mesh_path"] == r["path"] for r in mesh[1:] if "path" in r] == [True, True]
    written = []
    monkeypatch.setattr(bt, "write_section", lambda *args: written.append(args))
    assert bt.main(["--render", str(tmp_path / "tpu_results.json")]) == 0
    body = written[0][2]
    # Off a TPU only the attention rows' targets (4096 tokens on, JAX's TPU kernel) are
    # not run.
    assert [
        line for line in body.splitlines() if "not run" in line and "attention, " not in line
    ] == []
    assert "| bfloat16 | swapped residual-only (XLA path) |" in body


def _mesh_rows(ratio: float) -> list[dict[str, Any]]:
    attention = {"kind": "attention", "length": 4096, "path": "TPU kernels"}
    attention.update(mesh_path="TPU kernels", ms=2.0, mesh_ms=2.0 * ratio, ratio=ratio)
    step = {"kind": "step", "dtype": "bfloat16", "name": bt.SWAPPED_ALL}
    step.update(plain_ms=60.0, mesh_ms=60.0 * ratio, mesh_ratio=ratio)
    return [attention, step]


@pytest.mark.parametrize(("ratio", "verdict"), [(1.01, "met"), (1.05, "missed")])
def test_the_one_device_mesh_rows_are_held_to_the_plain_ones(ratio, verdict):
    md = bt.render({**_payload(), "mesh": _mesh_rows(ratio)})
    mesh = {k: v for k, v in _targets(md).items() if k.startswith("one-device mesh")}
    assert list(mesh.values()) == [verdict, verdict]
    assert (
        f"| attention fwd+bwd, 4096 tokens (TPU kernels / TPU kernels) | 2.00 | {2 * ratio:.2f}"
        in md
    )


def _model_rows(ratio: float) -> list[dict[str, Any]]:
    rows = []
    for model in bt.MODEL_SHAPES:
        if model == "wide":
            continue  # a run cut short: its rows and target read "not run"
        for dtype in bt.MODEL_DTYPES.get(model, bt.STEP_DTYPES):
            base = {"model": model, "dtype": dtype, "compile_s": 10.0, "temp_mib": 100.0}
            rows.append({**base, "name": bt.NO_DROPOUT, "step_ms": 20.0})
            rows.append(
                {**base, "name": bt.SWAPPED_ALL, "step_ms": 20.0 * ratio, "ratio": ratio}
                | {"path": bt.KERNEL, "attention_path": "XLA"}
            )
    return rows


@pytest.mark.parametrize(("ratio", "verdict"), [(1.08, "met"), (1.27, "missed")])
def test_each_model_shape_is_held_to_its_step_without_dropout(ratio, verdict):
    md = bt.render({**_payload(), "models": _model_rows(ratio)})
    models = {k: v for k, v in _targets(md).items() if " / no dropout <= 1.1x" in k and "[" in k}
    assert len(models) == 7  # five shapes, two of them in float32 too
    wide = "wide [16, 1024, 1024] bfloat16: swapped full, attention too / no dropout <= 1.1x"
    assert models.pop(wide) == "not run"
    assert set(models.values()) == {verdict}
    assert "### Model shapes" in md and "ViT-B/16: [64, 197, 768], 12 heads, MLP 3072" in md
    assert (
        f"| ViT-B/16 | float32 | swapped full, attention too (TPU kernel; attention: XLA) | "
        f"{20 * ratio:.2f} | {ratio:.3f} | 100 | 10.0 |" in md
    )


def test_a_run_without_the_models_part_renders_no_model_table():
    md = bt.render(_payload())
    assert "### Model shapes" not in md
    assert not [k for k in _targets(md) if "ViT" in k]


@pytest.mark.parametrize("value", ["all", "none,gelu"])
def test_model_rows_refuses_rows_it_does_not_know_or_without_none_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as err:
        bt.main(["--quick", "--model-rows", value])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "--model-rows: expected some of none, residual, all, flax" in lines[0]


@pytest.mark.parametrize("value", ["fast", "default,cpu", ""])
def test_check_ways_refuses_ways_it_does_not_know_in_one_line(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bt.main(["--quick", "--check-ways", value])
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "--check-ways: expected some of default, kernel, XLA" in lines[0]


def test_check_ways_run_only_the_ways_asked_for(tmp_path: Path, monkeypatch):
    """The CPU reference (a subprocess) is this process's here; the checks' outputs too."""
    monkeypatch.setattr(bt, "_check_cases", lambda: {"ones": lambda: np.ones(3)})
    monkeypatch.setattr(bt.subprocess, "run", lambda cmd, **_: bt.reference(cmd[-1]))
    got = bt.checks(tmp_path, bt._check_ways("XLA,default"))
    assert got == {"ones": {"default": True, "XLA": True}}


def test_model_rows_keep_the_cheapest_first():
    assert bt._model_rows("flax,all,none") == (bt.NO_DROPOUT, bt.SWAPPED_ALL, bt.FLAX_FULL)


def _anchor_rows(ours_ms: float, ours_temp: float) -> list[dict[str, Any]]:
    rows = []
    for case, (depth, causal, _, lengths) in bt.ANCHOR_CASES.items():
        for length in lengths:
            if length == 32768:
                continue  # a run cut short
            scale = length / 4096
            times = {
                bt.OURS_DROPOUT: ours_ms * scale,
                bt.OURS_PLAIN: 0.9 * ours_ms * scale,
                bt.splash_name(1024): 2.0 * scale,
                bt.splash_name(512): 2.2 * scale,
            }
            for name, ms in times.items():
                row = {"case": case, "length": length, "name": name, "fwd_bwd_ms": ms}
                row["temp_mib"] = ours_temp if name == bt.OURS_DROPOUT else 3.0
                row["peak_fraction"] = bt.attention_flops(length, depth, causal) / (
                    ms * 1e-3 * bt.V5E_BF16_PEAK
                )
                rows.append(row)
    rows.append({"case": "full, depth 128", "length": 8192, "name": "x", "error": "E: no"})
    return rows


@pytest.mark.parametrize(
    ("ours_ms", "ours_temp", "verdict"), [(1.9, 2.0, "met"), (2.35, 35.0, "missed")]
)
def test_anchors_hold_dropmask_to_splash_at_its_best_tiles(ours_ms, ours_temp, verdict):
    md = bt.render({**_payload(), "anchors": _anchor_rows(ours_ms, ours_temp)})
    targets = {k: v for k, v in _targets(md).items() if "splash" in k}
    not_run = {k for k, v in targets.items() if v == "not run"}
    assert not_run == {
        f"causal, depth 128, 32768 tokens: {bt.OURS_DROPOUT} / splash's best tiles <= 1.0x",
        f"causal, depth 128, 32768 tokens: {bt.OURS_PLAIN} / splash's best tiles <= 0.95x",
        f"causal, depth 128, 32768 tokens: {bt.OURS_DROPOUT}'s temporaries - splash's <= 0 MiB",
    }
    assert {v for k, v in targets.items() if k not in not_run} == {verdict}
    assert "### Against the public kernels at tuned tiles" in md
    assert (
        f"| causal, depth 128 | 4096 | {bt.OURS_DROPOUT} | {ours_ms:.2f} | {ours_ms / 2:.3f} |"
        in md
    )
    assert "full, depth 128, 8192 tokens, x: did not run (E: no)" in md


def test_attention_flops_count_the_forward_three_and_a_half_times():
    assert bt.attention_flops(1024, 128, causal=False, heads=1) == 3.5 * 4 * 1024 * 1024 * 128
    assert bt.attention_flops(1024, 128, causal=True, heads=2) == 3.5 * 4 * 1024 * 1024 * 128


@pytest.mark.parametrize(
    ("causal", "kv_heads", "tile", "compute"),
    [(True, 2, 128, None), (False, 8, 128, None), (True, 8, 256, 128)],
)
def test_the_splash_anchor_computes_dropmasks_attention(causal, kv_heads, tile, compute):
    """Splash attention as the anchors call it (interpreted here): grouped heads by its
    MQA kernel, the scale applied to q, its tiles computed whole or in pieces
    (``compute``), the same function as dropmask's."""
    length, depth = 256, 64
    keys = jax.random.split(jax.random.key(0), 3)
    q = jax.random.normal(keys[0], (1, length, bt.ANCHOR_HEADS, depth), jnp.float32)
    k, v = (jax.random.normal(kk, (1, length, kv_heads, depth), jnp.float32) for kk in keys[1:])
    got = bt._splash(length, depth, causal, kv_heads, tile, compute)(q, k, v)
    want = dropmask.dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=2e-6)


def _short_rows(auto_ms: float) -> list[dict[str, Any]]:
    rows = []
    for dtype, lengths in bt.SHORT_LENGTHS.items():
        for length in lengths:
            if length == 2048:
                continue  # a run cut short
            scale = length / 128
            times = {bt.SHORT_AUTO: auto_ms, bt.SHORT_DENSE: 1.1, bt.FLAX_DENSE: 1.0}
            for name, ms in times.items():
                row = {"dtype": dtype, "length": length, "name": name, "compile_s": 2.0}
                row.update(fwd_bwd_ms=ms * scale, temp_mib=1.5)
                if name != bt.FLAX_DENSE:
                    row["path"] = "XLA"
                rows.append(row)
    return rows


@pytest.mark.parametrize(("auto_ms", "verdict"), [(0.9, "met"), (1.2, "missed")])
def test_short_attention_holds_auto_to_flaxs_dense_attention(auto_ms, verdict):
    md = bt.render({**_payload(), "short": _short_rows(auto_ms)})
    targets = {k: v for k, v in _targets(md).items() if k.startswith("short attention")}
    assert len(targets) == sum(len(v) for v in bt.SHORT_LENGTHS.values())
    assert {k for k, v in targets.items() if v == "not run"} == {
        f"short attention, bfloat16, 2048 tokens: {bt.SHORT_AUTO} / Flax's dense attention, "
        f"dropout {bt.RATE} <= 1.0x"
    }
    assert {v for v in targets.values() if v != "not run"} == {verdict}
    assert "### Short attention" in md
    assert f"| bfloat16 | 197 | {bt.SHORT_AUTO} (XLA) | {auto_ms * 197 / 128:.3f} |" in md


def test_short_attention_takes_the_paired_ratio_where_rounds_timed_it():
    rows = _short_rows(1.2)  # medians 1.2x Flax's ...
    for row in rows:
        row["ratio"] = 0.95  # ... and the round-by-round ratios under it
    md = bt.render({**_payload(), "short": rows})
    targets = {k: v for k, v in _targets(md).items() if k.startswith("short attention")}
    assert {v for v in targets.values() if v != "not run"} == {"met"}
    assert f"| bfloat16 | 197 | {bt.SHORT_AUTO} (XLA) | {1.2 * 197 / 128:.3f} | 0.950 |" in md
    assert "rotating order" in md


def test_rounds_rotate_which_program_runs_first():
    order = []
    exes = [lambda *a, i=i: order.append(i) or jnp.zeros(()) for i in range(3)]
    times = bt._rounds(exes, (), 4)
    assert [len(t) for t in times] == [4, 4, 4]
    timed = order[3:]  # after one warm-up call each
    firsts = [timed[r * 3 * bt.SHORT_CALLS] for r in range(4)]
    assert firsts == [0, 1, 2, 0]


def test_a_run_without_the_short_part_renders_no_short_table():
    md = bt.render(_payload())
    assert "### Short attention" not in md
    assert not [k for k in _targets(md) if k.startswith("short attention")]


def test_model_shapes_refuse_a_shape_they_do_not_know_in_one_line(capsys):
    with pytest.raises(SystemExit) as err:
        bt.main(["--quick", "--model-shapes", "ViT-B/16,ResNet"])
    assert err.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "--model-shapes: expected some of ViT-B/16, BERT-base" in lines[0]
    assert "got 'ViT-B/16,ResNet'" in lines[0]


def test_model_shapes_keep_their_table_order():
    assert bt._model_shapes("short,ViT-B/16") == ("ViT-B/16", "short")
