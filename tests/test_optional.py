"""Optional dependencies: loaded in one module, a missing one names the extra to install."""

import pathlib
import re
import sys

import pytest

from dropmask import DropmaskError, DropmaskValueError
from dropmask._optional import EXTRAS, require
from dropmask._workflow import locate

SRC = pathlib.Path(__file__).resolve().parents[1] / "src" / "dropmask"


def test_a_missing_dependency_is_one_line_naming_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(DropmaskError, match=r"^translate: needs the package 'sentencepiece'"):
        require("sentencepiece", caller="translate")
    with pytest.raises(DropmaskError, match=re.escape("pip install 'dropmask[examples]'")):
        require("sentencepiece")
    assert require("json").dumps([]) == "[]"


def test_no_module_of_the_package_imports_an_optional_dependency_itself():
    pattern = re.compile(rf"^\s*(import|from) ({'|'.join(EXTRAS)})\b", re.M)
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if path.name != "_optional.py" and pattern.search(path.read_text())
    ]
    assert not offenders, offenders


def test_a_target_that_lacks_an_example_dependency_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    (tmp_path / "train.py").write_text("import sacrebleu\n")
    with pytest.raises(DropmaskValueError, match=re.escape("pip install 'dropmask[examples]'")):
        locate(str(tmp_path))
