"""``dropmask.why``: the report, its JSON, the command, and running from an installed wheel."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import dropmask
from dropmask import why
from dropmask.why import _command as _why_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
VERDICTS = {why.HOLDS, why.NOT, why.DEPENDS}


@pytest.mark.slow  # seconds of measurement
def test_the_timed_report():
    """One timed report (seconds of measurement) for every check below: as a fixture of
    several tests, each pytest-xdist worker that ran one of them measured it again."""
    timed = why.check_claims(timing=True, size=1 << 14, repeats=3)
    _every_claim_has_a_verdict_and_evidence(timed)
    _timing_claims_report_positive_times_and_ratios(timed)
    _report_prints_a_table_and_round_trips_through_json(timed)


def _every_claim_has_a_verdict_and_evidence(timed):
    ids = [c.id for c in timed.claims]
    assert len(ids) == len(set(ids)) == 16
    for claim in timed.claims:
        assert claim.verdict in VERDICTS
        assert claim.evidence and claim.claim
    assert timed.jax_version and timed.backend and timed.seconds > 0


def _timing_claims_report_positive_times_and_ratios(timed):
    claims = {c.id: c for c in timed.claims}
    for cid in ("where-slower", "multiply-slower"):
        ratios = claims[cid].data["ratios"]
        assert set(ratios) == {"f32 fwd", "f32 fwd+bwd", "bf16 fwd", "bf16 fwd+bwd"}
        assert all(r > 0 for r in ratios.values())
        assert claims[cid].data["noise"] >= 1.15
    for row in claims["dropmask-faster"].data["ms"].values():
        assert all(ms > 0 for ms in row.values())
    cond = claims["mask-beats-cond"].data
    assert all(cond[k] > 0 for k in cond if k.endswith("ms"))
    # Batching a cond with a per-example predicate turns it into a select of both branches.
    assert cond["vmap cond keeps a cond"] is False


def _report_prints_a_table_and_round_trips_through_json(timed):
    text = str(timed)
    assert text.startswith(f"dropmask why: jax {timed.jax_version}")
    for claim in timed.claims:
        assert f"[{claim.id}]" in text
    data = json.loads(timed.to_json())
    assert [c["verdict"] for c in data["claims"]] == [c.verdict for c in timed.claims]


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    _why_command.add_arguments(parser)
    return _why_command.run(parser.parse_args(list(argv)))


def test_command_prints_json(capsys):
    assert _run("--json", "--no-timing") == 0
    data = json.loads(capsys.readouterr().out)
    verdicts = {c["id"]: c["verdict"] for c in data["claims"]}
    assert verdicts["where-is-select"] == "holds"
    assert "where-slower" not in verdicts


def test_bad_sizes_raise():
    with pytest.raises(dropmask.DropmaskValueError, match="size and repeats"):
        why.check_claims(size=0)


@pytest.mark.slow
def test_runs_from_an_installed_wheel(tmp_path):
    """Build a wheel, unpack it outside the checkout and run ``why`` with ``-I``."""
    # Built from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(source)],
        capture_output=True,
        text=True,
        check=False,
    )
    if build.returncode and "No matching distribution" in build.stderr:
        pytest.skip("no package index for the wheel's build requirements")
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = tmp_path.glob("dropmask-*.whl")
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert (site / "dropmask" / "why" / "__init__.py").is_file()
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import dropmask, json; "
        "assert dropmask.__file__.startswith(sys.argv[1]), dropmask.__file__; "
        "from dropmask.why import _command as c; import argparse; p = argparse.ArgumentParser(); "
        "c.add_arguments(p); sys.exit(c.run(p.parse_args(['--json', '--no-timing'])))"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-I", "-c", code, str(site)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    verdicts = {c["id"]: c["verdict"] for c in json.loads(done.stdout)["claims"]}
    assert verdicts["where-is-select"] == "holds"
    assert verdicts["tiny-nonzero"] == "does not hold"


def test_a_verdict_that_differs_from_the_document_fails_the_command(monkeypatch, capsys):
    changed = why.WhyReport(
        "0", "cpu", "cpu", "x86_64", (why.Claim("where-is-select", "c", why.NOT, "e", []),), 0.0
    )
    assert changed.differences() == {"where-is-select": (why.HOLDS, why.NOT)}
    assert "CHANGED: where-is-select" in str(changed)
    monkeypatch.setattr(_why_command, "check_claims", lambda **kwargs: changed)
    assert _run("--no-timing") == 1
    assert "CHANGED: where-is-select" in capsys.readouterr().out
    agreeing = why.WhyReport(
        "0", "cpu", "cpu", "x86_64", (why.Claim("where-is-select", "c", why.HOLDS, "e", []),), 0.0
    )
    monkeypatch.setattr(_why_command, "check_claims", lambda **kwargs: agreeing)
    assert _run("--no-timing") == 0
    assert "CHANGED" not in capsys.readouterr().out
