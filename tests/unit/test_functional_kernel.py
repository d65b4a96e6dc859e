"""Which kernel records the functional collectives (rank/recorder/functional_kernel.py): the C++
one only where its build is for the torch that runs - a build for another torch is refused from
what the file says, before it is loaded - and the Python one when asked for or when there is no
such build. (Both kernels' records, side by side in real jobs:
tests/integration/test_functional_kernel_records.py.)"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from nccl_doctor.rank.recorder import functional_kernel as fk


@pytest.mark.parametrize("value, choice", [
    (None, "auto"), ("", "auto"), ("python", "python"), ("cpp", "cpp"), (" CPP ", "cpp"),
    ("c++", "auto"),  # not a choice: the default
])
def test_the_kernel_asked_for(monkeypatch, value, choice):
    if value is None:
        monkeypatch.delenv(fk.KERNEL_ENV, raising=False)
    else:
        monkeypatch.setenv(fk.KERNEL_ENV, value)
    assert fk.wanted() == choice


def fake_build(path: Path, built_for: str) -> Path:
    path.write_bytes(b"\x7fELF" + b"\0" * 64 + fk.MARKER + built_for.encode() + b"\n\0" * 8)
    return path


def test_the_torch_a_build_is_for_is_read_from_the_file(tmp_path):
    assert fk.recorded_in(fake_build(tmp_path / "k.so", "2.13.0+cpu abc123")) == \
        "2.13.0+cpu abc123"
    (tmp_path / "other.so").write_bytes(b"\x7fELF no marker")
    assert fk.recorded_in(tmp_path / "other.so") is None
    assert fk.recorded_in(tmp_path / "missing.so") is None


class FakeTorch:
    __version__ = "2.13.0+cpu"

    class version:
        git_version = "abc123"


def test_a_build_for_another_torch_is_refused_before_it_is_loaded(tmp_path, monkeypatch):
    built = fake_build(tmp_path / "_functional_kernel.so", "2.12.1+cpu 0ld")
    spec = importlib.machinery.ModuleSpec(fk.MODULE, None, origin=str(built))
    monkeypatch.setattr(fk.importlib.util, "find_spec", lambda name: spec)

    def never(name):
        raise AssertionError(f"{name} was loaded")

    monkeypatch.setattr(fk.importlib, "import_module", never)
    with pytest.raises(fk.KernelUnavailable) as refused:
        fk.load(FakeTorch)
    assert refused.value.stale
    assert "was built for torch 2.12.1+cpu 0ld, not this one (2.13.0+cpu abc123)" in \
        str(refused.value) and "make install" in str(refused.value)


def test_no_build_is_no_kernel_and_nothing_to_mend(monkeypatch):
    monkeypatch.setattr(fk.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(fk.KernelUnavailable) as missing:
        fk.load(FakeTorch)
    assert not missing.value.stale and str(missing.value).startswith("not built")


def test_the_build_here_is_for_this_torch_and_loads():
    """make install builds the C++ kernel where a C++ compiler and torch's headers are: here, it
    must be there, for this torch (a skip only where it cannot be built, never on CI)."""
    import torch

    spec = importlib.util.find_spec(fk.MODULE)
    if spec is None:
        headers = Path(torch.__file__).parent / "include" / "torch" / "library.h"
        if os.environ.get("CI") or (shutil.which(os.environ.get("CXX") or "c++")
                                    and headers.exists()):
            pytest.fail("the C++ kernel is not built, though it can be here: make install")
        pytest.skip("no C++ compiler or no torch headers here to build the C++ kernel")
    assert fk.recorded_in(Path(spec.origin)) == fk.built_for(torch)
    module = fk.load(torch)
    assert module.BUILT_FOR == fk.built_for(torch)
    assert {"issue_fast", "issue_python", "wait_fast"} <= set(module.counts())


class FakeRecorder:
    recording = object()  # (the recorder's C fast path in use)


def stale(torch):
    raise fk.KernelUnavailable("/x/_functional_kernel.so was built for torch 0.1, not this one "
                               "(2.13): make install builds it again", stale=True)


def test_a_stale_build_is_said_once_and_the_python_kernel_records(monkeypatch, capsys):
    from nccl_doctor.rank.recorder import functional

    monkeypatch.setattr(fk, "load", stale)
    monkeypatch.delenv(fk.KERNEL_ENV, raising=False)
    assert functional._cpp_kernel(FakeRecorder(), None) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "recorded by the Python kernel" in err
    assert "built for torch 0.1" in err and "make install" in err
    assert "built for torch 0.1" in functional.KERNEL_WHY
    monkeypatch.setenv(fk.KERNEL_ENV, "cpp")  # asked for it alone: refused, with the reason
    with pytest.raises(fk.KernelUnavailable, match="=cpp, but the C.. kernel cannot be used: "):
        functional._cpp_kernel(FakeRecorder(), None)


def test_a_kernel_that_is_not_built_is_no_news(monkeypatch, capsys):
    from nccl_doctor.rank.recorder import functional

    def missing(torch):
        raise fk.KernelUnavailable("not built")

    monkeypatch.setattr(fk, "load", missing)
    monkeypatch.delenv(fk.KERNEL_ENV, raising=False)
    assert functional._cpp_kernel(FakeRecorder(), None) is None
    assert capsys.readouterr().err == "" and functional.KERNEL_WHY == "not built"
    monkeypatch.setenv(fk.KERNEL_ENV, "python")
    monkeypatch.setattr(fk, "load", stale)
    assert functional._cpp_kernel(FakeRecorder(), None) is None
    assert capsys.readouterr().err == ""
