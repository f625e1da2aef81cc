"""--config.NAME=VALUE overrides: typed by the current value, unknown entries refused."""

import ml_collections
import pytest

from dropmask import DropmaskError
from dropmask.training import base_config
from dropmask.training._config import apply_overrides, parse_overrides


def _config() -> ml_collections.ConfigDict:
    config = base_config()
    config.hidden = (8, 8)
    config.name = "mlp"
    config.flag = False
    config.model = ml_collections.ConfigDict({"width": 4})
    return config


def test_values_take_the_type_of_the_current_entry():
    pairs = parse_overrides(
        ["--config.steps=7", "--config.rate", "0.25", "--config.hidden=(3,)", "--config.name=x=y"]
        + ["--config.flag=true", "--config.model.width=16", "--config.hidden=[1, 2]"]
    )
    config = apply_overrides(_config(), pairs)
    assert config.steps == 7 and isinstance(config.steps, int)
    assert config.rate == 0.25 and config.name == "x=y" and config.flag is True
    assert config.model.width == 16
    assert config.hidden == (1, 2)  # the last override wins, as a tuple
    assert _config().steps == 1000  # the input is not changed


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["--config.nope=1"], "--config.nope: no such config entry"),
        (["--config.model.depth=1"], "--config.model.depth: no such config entry"),
        (["--config.steps=1.5"], "not a valid int"),
        (["--config.flag=maybe"], "not a valid bool"),
        (["--config.hidden=(1,"], "not a valid tuple"),
    ],
)
def test_bad_overrides_name_the_entry(args, match):
    with pytest.raises(DropmaskError, match=match):
        apply_overrides(_config(), parse_overrides(args))


def test_parse_refuses_other_arguments_and_missing_values():
    with pytest.raises(DropmaskError, match="unrecognized argument '--fast'"):
        parse_overrides(["--fast"])
    with pytest.raises(DropmaskError, match="needs a value"):
        parse_overrides(["--config.steps"])
