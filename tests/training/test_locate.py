"""One target loader for `dropmask train` and `dropmask audit`: names, paths, module:attribute."""

import json
import pathlib
import sys

import pytest

from dropmask import DropmaskTypeError, DropmaskValueError, cli
from dropmask.training import Example
from dropmask.training._locate import available, load_example, locate

USER_EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "user_example"


def _one_line(err: str, *words: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    for word in words:
        assert word in lines[0], (word, lines[0])


def test_a_bundled_name_is_the_packaged_example():
    example = load_example("digits")
    assert isinstance(example, Example) and example.name == "digits"
    assert example.create_state.__module__ == "dropmask.examples.digits.train"
    assert locate("digits").where.endswith("dropmask/examples/digits/train.py:example")


def test_a_directory_a_file_and_module_attribute_name_the_same_kind_of_target():
    by_dir = load_example(str(USER_EXAMPLE))
    assert by_dir.name == "blobs"
    assert load_example(str(USER_EXAMPLE)) is by_dir  # imported once
    assert load_example("tests.user_example.train:example").name == "blobs"
    assert load_example("tests.user_example.train").name == "blobs"
    file_target = locate(str(USER_EXAMPLE / "models.py"), attributes=("Classifier",))
    assert file_target.value.__name__ == "Classifier"


def test_a_users_examples_package_is_left_alone(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "examples"
    mine.mkdir()
    (mine / "__init__.py").write_text("MINE = True\n")
    monkeypatch.chdir(tmp_path)
    before = sys.modules.get("examples")
    assert load_example("digits").name == "digits"
    assert sys.modules.get("examples") is before
    assert cli.main(["train", "--list"]) == 0
    assert "digits" in capsys.readouterr().out


def test_list_says_where_each_example_lives(capsys):
    names = [name for name, _, _ in available()]
    assert names[0] == "digits" and {"sst2", "seq2seq", "translate"} <= set(names)
    assert cli.main(["audit", "--list"]) == 0
    out = capsys.readouterr().out
    assert "dropmask.examples.digits.train" in out and "examples/translate" in out


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("no_such_example", ["no example 'no_such_example'", "--list"]),
        ("nowhere/at/all.py", ["no file"]),
        ("no_such_package.train:example", ["no module 'no_such_package.train'"]),
        ("tests.user_example.train:missing", ["no attribute 'missing'"]),
    ],
)
def test_an_unknown_target_is_one_line_naming_what_was_tried(target, words, capsys):
    assert cli.main(["train", target]) == 2
    _one_line(capsys.readouterr().err, "dropmask train: error", *words)


def test_a_broken_target_names_its_failing_line(tmp_path, capsys):
    (tmp_path / "train.py").write_text("import json\n\nraise RuntimeError('half written')\n")
    assert cli.main(["audit", str(tmp_path)]) == 2
    _one_line(capsys.readouterr().err, "dropmask audit: error", "train.py:3", "half written")
    with pytest.raises(DropmaskValueError, match="without a train.py"):
        locate(str(USER_EXAMPLE.parent))


def test_a_target_that_is_not_an_example_is_refused():
    with pytest.raises(DropmaskTypeError, match="must be a dropmask.training.Example"):
        load_example("tests.user_example.models:Classifier")


def test_train_and_audit_a_users_directory(tmp_path, capsys):
    workdir = tmp_path / "run"
    status = cli.main(["train", str(USER_EXAMPLE), "--no-progress", f"--workdir={workdir}"])
    assert status == 0, capsys.readouterr().err
    assert json.loads((workdir / "summary.json").read_text())["steps"] == 8
    assert cli.main(["audit", str(USER_EXAMPLE)]) == 0
    assert "OK: no finding." in capsys.readouterr().out


USER_NNX_EXAMPLE = USER_EXAMPLE.parent / "user_example_nnx"


@pytest.mark.parametrize(
    "target", [str(USER_NNX_EXAMPLE), "tests.user_example_nnx.train:example", "digits_nnx"]
)
def test_train_and_audit_a_users_nnx_directory_module_and_the_bundled_nnx_example(
    target, tmp_path, capsys
):
    workdir = tmp_path / "run"
    argv = ["train", target, "--no-progress", f"--workdir={workdir}"]
    if target == "digits_nnx":
        argv += ["--steps=4", "--config.eval_every=2", "--config.checkpoint_every=2"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["steps"] == (4 if target == "digits_nnx" else 8)
    assert cli.main(["audit", target]) == 0
    out = capsys.readouterr().out
    assert "OK: no finding." in out and "dropout" in out
