"""One target loader for `dropmask train` and `dropmask audit`: names, paths, module:attribute."""

import json
import pathlib
import shutil
import sys

import pytest

from dropmask import DropmaskTypeError, DropmaskValueError, cli
from dropmask._workflow import _locate, available, load_example, locate
from dropmask._workflow._locate import checkout_examples
from dropmask.training import Example

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


def test_the_checkout_examples_are_those_of_the_editable_install_or_the_current_directory(
    tmp_path, monkeypatch
):
    root = pathlib.Path(__file__).resolve().parents[2]

    editable = {"url": root.as_uri(), "dir_info": {"editable": True}}
    monkeypatch.setattr(_locate, "_direct_url", lambda: json.dumps(editable))
    monkeypatch.chdir(tmp_path)
    assert checkout_examples() == root / "examples"

    wheel = {"url": (tmp_path / "dropmask.whl").as_uri(), "archive_info": {}}
    monkeypatch.setattr(_locate, "_direct_url", lambda: json.dumps(wheel))
    assert checkout_examples() is None
    assert ("sst2", "source checkout only: examples/sst2") in [r[:2] for r in available()]
    monkeypatch.chdir(root / "examples" / "translate")
    assert checkout_examples() == root / "examples"
    assert load_example("translate").name == "translate"


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


# A training run: the command audits a copy of this directory in
# test_audit_without_model_inputs_audits_the_train_step, and trains and audits the
# user's NNX directory in the last test.
@pytest.mark.slow
def test_train_and_audit_a_users_directory(tmp_path, capsys):
    workdir = tmp_path / "run"
    status = cli.main(["train", str(USER_EXAMPLE), "--no-progress", f"--workdir={workdir}"])
    assert status == 0, capsys.readouterr().err
    assert json.loads((workdir / "summary.json").read_text())["steps"] == 8
    assert cli.main(["audit", str(USER_EXAMPLE)]) == 0
    assert "OK: no finding." in capsys.readouterr().out


# A user's mistakes: one line naming the user's file and line and the fix, a non-zero
# exit, no traceback and no internal function's name.


def test_list_states_the_context_lms_configs_use(capsys, monkeypatch):
    import dataclasses

    from examples.lm import configs

    def lm_line() -> str:
        assert cli.main(["train", "--list"]) == 0
        lines = capsys.readouterr().out.splitlines()
        return lines[lines.index(next(x for x in lines if x.startswith("lm "))) + 1]

    default, long = configs.get_config().context, configs.get_long_config().context
    assert lm_line().endswith(f"model (context {default}; --config long: context {long})")
    # Read from the example's configs, not written beside them: it follows a change.
    module = _locate._import_directory(checkout_examples() / "lm", "lm")

    def get_config():
        config = configs.get_config()
        config.context = 77
        return config

    monkeypatch.setattr(
        module, "example", dataclasses.replace(module.example, get_config=get_config)
    )
    small = configs.get_small_data_config().context
    assert lm_line().endswith(
        f"model (context 77; --config long: context {long}; --config small_data: context {small})"
    )


def _users_copy(tmp_path, old: str = "", new: str = "") -> pathlib.Path:
    """tests/user_example copied to ``tmp_path``, ``old`` replaced by ``new`` in train.py."""
    directory = tmp_path / "mine"
    shutil.copytree(USER_EXAMPLE, directory, ignore=shutil.ignore_patterns("__pycache__"))
    train = directory / "train.py"
    text = train.read_text()
    if old:
        assert old in text, old
        train.write_text(text.replace(old, new, 1))
    return directory


def _line_of(path: pathlib.Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def _no_internals(err: str) -> None:
    for word in ("Traceback", "locate:", "_locate.py", "copy_and_resolve_references", "bug in"):
        assert word not in err, (word, err)


@pytest.mark.parametrize("command", ["train", "audit"])
def test_get_config_returning_a_dict_is_one_line_at_the_users_function(command, tmp_path, capsys):
    mine = _users_copy(tmp_path, "    return config\n", "    return config.to_dict()\n")
    status = cli.main([command, str(mine), "--no-progress"][: 2 if command == "audit" else 3])
    err = capsys.readouterr().err
    assert status != 0
    line = _line_of(mine / "train.py", "def get_config")
    _one_line(err, f"train.py:{line}", "get_config must return an ml_collections.ConfigDict")
    assert "got a dict" in err and "base_config()" in err
    _no_internals(err)


def test_a_named_config_returning_a_dict_names_the_function_called(tmp_path, capsys):
    mine = _users_copy(
        tmp_path,
        "example = Example(\n",
        "example = Example(\n    configs={'big': get_big_config},\n",
    )
    train = mine / "train.py"
    text = train.read_text().replace(
        "\ndef load_data(",
        "\ndef get_big_config():\n    return get_config().to_dict()\n\n\ndef load_data(",
    )
    train.write_text(text)
    assert cli.main(["train", str(mine), "--config", "big"]) == 2
    line = _line_of(train, "def get_big_config")
    _one_line(
        capsys.readouterr().err,
        f"train.py:{line}: example.configs['big'] (get_big_config) must return an "
        "ml_collections.ConfigDict, got a dict",
    )


def test_a_plain_field_of_the_wrong_kind_names_the_example_line(tmp_path, capsys):
    mine = _users_copy(tmp_path, 'best_mode="max"', 'best_mode="maximum"')
    assert cli.main(["train", str(mine)]) == 2
    line = _line_of(mine / "train.py", "example = Example(")
    _one_line(capsys.readouterr().err, f"train.py:{line}", "best_mode must be 'max' or 'min'")


def test_a_train_step_returning_the_wrong_type_is_one_line(tmp_path, capsys):
    mine = _users_copy(
        tmp_path, 'return state.apply_gradients(grads=grads), {"loss": loss}', "return loss"
    )
    status = cli.main(["train", str(mine), "--no-progress", f"--workdir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert status == 2
    line = _line_of(mine / "train.py", "def train_step") - 1  # its @jax.jit line
    _one_line(err, f"train.py:{line}", "train_step must return a pair (new_state, metrics)")
    _no_internals(err)


def test_a_syntax_error_is_located_at_the_users_line(tmp_path, capsys):
    mine = _users_copy(tmp_path, "    config.batch_size = 16\n", "    config.batch_size = = 16\n")
    assert cli.main(["train", str(mine)]) == 2
    err = capsys.readouterr().err
    line = _line_of(mine / "train.py", "batch_size = = 16")
    _one_line(err, f"train.py:{line}", "SyntaxError")
    assert "importlib" not in err and "frozen" not in err
    _no_internals(err)


def test_sys_exit_at_import_is_refused_not_a_silent_success(tmp_path, capsys):
    mine = _users_copy(tmp_path, "from .models import Classifier\n", "import sys\nsys.exit(0)\n")
    assert cli.main(["train", str(mine)]) == 2
    err = capsys.readouterr().err
    line = _line_of(mine / "train.py", "sys.exit(0)")
    _one_line(err, "sys.exit(0)", f"train.py:{line}", "if __name__ == '__main__':")


def test_a_file_with_relative_imports_hints_at_its_directory(tmp_path, capsys):
    mine = _users_copy(tmp_path)
    assert cli.main(["train", str(mine / "train.py")]) == 2
    err = capsys.readouterr().err
    line = _line_of(mine / "train.py", "from .models import")
    _one_line(err, f"train.py:{line}", "pass its directory instead", f"dropmask train {mine}")


@pytest.mark.parametrize("command", ["train", "audit"])
def test_an_empty_target_names_no_internal_function(command, capsys):
    assert cli.main([command, ""]) == 2
    err = capsys.readouterr().err
    _one_line(err, f"dropmask {command}: error", "TARGET must be a non-empty string")
    _no_internals(err)


def test_an_exception_in_the_users_evaluate_keeps_its_traceback_and_says_whose(tmp_path, capsys):
    mine = _users_copy(
        tmp_path,
        "    accuracy = jnp.mean(",
        "    raise KeyError('no such split: ' + split)\n    accuracy = jnp.mean(",
    )
    status = cli.main(["train", str(mine), "--no-progress", f"--workdir={tmp_path / 'run'}"])
    err = capsys.readouterr().err
    assert status == 1
    assert "Traceback" in err and "KeyError" in err
    last = err.strip().splitlines()[-1]
    line = _line_of(mine / "train.py", "raise KeyError")
    assert last.startswith("dropmask train: error: the example's evaluate raised KeyError"), last
    assert f"train.py:{line}, in your code" in last and "bug in dropmask" not in err


def test_audit_without_model_inputs_audits_the_train_step(tmp_path, capsys):
    mine = _users_copy(tmp_path, "    model_inputs=lambda batch:", "    _unused=lambda batch:")
    text = (
        (mine / "train.py")
        .read_text()
        .replace('    _unused=lambda batch: (jnp.asarray(batch["x"]),),\n', "")
    )
    (mine / "train.py").write_text(text)
    status = cli.main(["audit", str(mine)])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "train step only" in err
    assert "OK: no finding." in out and "Dropout" in out


def test_an_exception_in_the_users_model_outside_a_hook_says_whose(tmp_path, capsys):
    mine = _users_copy(tmp_path)
    models = mine / "models.py"
    models.write_text(
        models.read_text().replace(
            "        x = nn.relu(",
            "        if training:\n            raise ValueError('not ready')\n        x = nn.relu(",
        )
    )
    assert cli.main(["audit", str(mine)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    last = err.strip().splitlines()[-1]
    line = _line_of(models, "raise ValueError")
    assert last.startswith("dropmask audit: error: ValueError raised at"), last
    assert f"models.py:{line}, in your code: not ready" in last and "bug in" not in err


USER_NNX_EXAMPLE = USER_EXAMPLE.parent / "user_example_nnx"


# The user's directory and the bundled example run; the module:attribute target is the
# same example as the directory (checked here without a run, as the Linen user
# example's targets are above).
@pytest.mark.parametrize(
    "target", [pytest.param(str(USER_NNX_EXAMPLE), marks=pytest.mark.slow), "digits_nnx"]
)
def test_train_and_audit_a_users_nnx_directory_module_and_the_bundled_nnx_example(
    target, tmp_path, capsys
):
    if target == str(USER_NNX_EXAMPLE):
        by_module, by_dir = (
            load_example("tests.user_example_nnx.train:example"),
            load_example(target),
        )
        assert by_module.name == by_dir.name == "blobs_nnx"
        for hook in ("create_state", "load_data"):
            code = (getattr(e, hook).__code__ for e in (by_module, by_dir))
            assert len({(c.co_filename, c.co_firstlineno) for c in code}) == 1, hook
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
