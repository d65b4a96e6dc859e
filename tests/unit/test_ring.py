"""The event ring's two implementations: the C accelerator must write exactly what Python writes."""

from __future__ import annotations

import importlib.util
import platform
import random
import shutil
import struct
import sys
import sysconfig
import time
import zlib
from pathlib import Path

import pytest

from nccl_doctor.capture import format as fmt
from nccl_doctor.capture import ring as ring_mod
from nccl_doctor.capture.ring import PyRing

C_RING = ring_mod._CRing
needs_c = pytest.mark.skipif(C_RING is None, reason="the C ring was not built (no compiler)")

OFFSET = 64
LIMITS = [  # the range of each ENTER field after idx (struct "<QQQqQQIIIIIIIIIIiiIBBH")
    (0, 2**64 - 1), (1, 2**64 - 1), (-(2**63), 2**63 - 1), (0, 2**64 - 1), (0, 2**64 - 1),
    *[(0, 2**32 - 1)] * 10, (-(2**31), 2**31 - 1), (-(2**31), 2**31 - 1), (0, 2**32 - 1),
    (0, 255), (0, 255), (0, 65535),
]


def random_fields(rng: random.Random) -> tuple:
    # Edges as well as the middle of each range: sign and width handling is where C and struct
    # could disagree.
    return tuple(rng.choice([lo, hi, 0 if lo <= 0 <= hi else lo, rng.randint(lo, hi)])
                 for lo, hi in LIMITS)


def both(capacity: int, c_ring: object = C_RING) -> tuple[bytearray, PyRing, bytearray, object]:
    size = OFFSET + capacity * fmt.RECORD_SIZE + 32
    pybuf, cbuf = bytearray(size), bytearray(size)
    return pybuf, PyRing(pybuf, OFFSET, capacity), cbuf, c_ring(cbuf, OFFSET, capacity)


def portable_c_ring(tmp_path: Path) -> object:
    """The C ring's module built as on a machine without SSE2 (its portable Adler-32)."""
    from setuptools import Distribution, Extension

    source = Path(ring_mod.__file__).with_name("_ring.c")
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if not source.exists() or shutil.which(compiler) is None:  # an install from a wheel
        pytest.skip(f"no {source.name} or no C compiler ({compiler}) to build it with")
    ext = Extension("_ring", [str(source)], define_macros=[("NCCL_DOCTOR_PORTABLE", "1")])
    dist = Distribution({"ext_modules": [ext], "script_name": "setup.py"})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib, cmd.build_temp = str(tmp_path / "lib"), str(tmp_path / "tmp")
    cmd.ensure_finalized()
    cmd.run()
    built = tmp_path / "lib" / ("_ring" + sysconfig.get_config_var("EXT_SUFFIX"))
    spec = importlib.util.spec_from_file_location("_ring", built)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def assert_writes_as_python(c_ring: object, seed: int) -> bytearray:
    """Random records and exits through both rings, compared byte for byte after each; the C
    ring's buffer."""
    rng = random.Random(seed)
    pybuf, py, cbuf, c = both(capacity=16, c_ring=c_ring)
    for i in range(200):  # laps the 16-slot ring many times
        fields = random_fields(rng)
        assert py.begin(*fields) == c.begin(*fields) == i + 1
        if rng.random() < 0.7:  # some records stay open, as in a hang
            state, delta = rng.choice([1, 2, 3]), rng.randint(-(2**15), 2**15 - 1)
            t_exit = rng.randint(1, 2**64 - 1)
            py.end(i + 1, state, delta, t_exit)
            c.end(i + 1, state, delta, t_exit)
        assert py.count == c.count == i + 1
        assert pybuf == cbuf, f"rings differ after record {i + 1}"
    return cbuf


@needs_c
def test_c_ring_writes_the_same_bytes_as_python() -> None:
    assert_writes_as_python(C_RING, seed=7)


@needs_c
def test_the_installed_c_ring_checksums_with_simd_where_it_can() -> None:
    """x86-64 always has SSE2: the installed ring uses it (the test above checks its bytes)."""
    module = sys.modules[C_RING.__module__]
    expected = "sse2" if platform.machine().lower() in ("x86_64", "amd64") else "portable"
    assert module.ADLER32 == expected


@needs_c
def test_the_portable_c_ring_writes_the_same_bytes_as_python(tmp_path) -> None:
    """Where there is no SSE2 the C ring checksums with plain C: built here so, it agrees too."""
    module = portable_c_ring(tmp_path)
    assert module.ADLER32 == "portable"
    cbuf = assert_writes_as_python(module.Ring, seed=11)
    record = bytes(cbuf[OFFSET:OFFSET + fmt.ENTER.size])
    assert zlib.adler32(record) == struct.unpack_from("<I", cbuf, OFFSET + fmt.ENTER.size)[0]


@needs_c
def test_c_ring_ignores_an_exit_for_a_lapped_record() -> None:
    pybuf, py, cbuf, c = both(capacity=16)
    fields = (0, 5) + (1,) * 19
    for _ in range(17):  # record 17 reuses record 1's slot
        py.begin(*fields)
        c.begin(*fields)
    before = bytes(cbuf)
    c.end(1, 1, 1, 99)
    py.end(1, 1, 1, 99)
    assert bytes(cbuf) == before == bytes(pybuf)


@pytest.mark.parametrize("impl", ["python", pytest.param("c", marks=needs_c)])
def test_ring_stamps_the_clock_when_given_no_time(impl: str) -> None:
    cls = PyRing if impl == "python" else C_RING
    buf = bytearray(OFFSET + 16 * fmt.RECORD_SIZE)
    ring = cls(buf, OFFSET, 16)
    before = time.time_ns()
    idx = ring.begin(0, 0, *(1,) * 19)
    ring.end(idx, 1, 1)
    after = time.time_ns()
    fields = fmt.ENTER.unpack_from(buf, OFFSET)
    (check,) = fmt.CRC.unpack_from(buf, OFFSET + fmt.ENTER.size)
    t_exit, delta, state, word = fmt.EXIT.unpack_from(buf, OFFSET + fmt.EXIT_OFFSET)
    assert before <= fields[2] <= t_exit <= after
    assert check == zlib.adler32(bytes(buf[OFFSET : OFFSET + fmt.ENTER.size]))
    assert (delta, state) == (1, 1) and word == fmt.exit_check(idx, t_exit, 1, 1)


@pytest.mark.parametrize("impl", ["python", pytest.param("c", marks=needs_c)])
def test_ring_refuses_a_buffer_it_does_not_fit(impl: str) -> None:
    cls = PyRing if impl == "python" else C_RING
    with pytest.raises(ValueError, match="does not fit"):
        cls(bytearray(OFFSET + 15 * fmt.RECORD_SIZE), OFFSET, 16)


@pytest.mark.parametrize("impl", ["python", pytest.param("c", marks=needs_c)])
@pytest.mark.parametrize("field,value", [(0, 2**64), (2, 2**63), (6, 2**32), (15, -(2**31) - 1),
                                         (15, 2**31), (18, 256), (18, -1), (20, 65536)])
def test_ring_rejects_a_value_too_wide_for_its_field(impl: str, field: int, value: int) -> None:
    """Like struct.pack, both refuse (the recorder then disables itself) rather than wrap."""
    cls = PyRing if impl == "python" else C_RING
    buf = bytearray(OFFSET + 16 * fmt.RECORD_SIZE)
    ring = cls(buf, OFFSET, 16)
    fields = [0, 1] + [1] * 19
    fields[field] = value
    with pytest.raises((OverflowError, struct.error)):
        ring.begin(*fields)
    assert not any(buf), "nothing may be written for a refused record"


@needs_c
def test_c_ring_checks_its_argument_count() -> None:
    ring = C_RING(bytearray(OFFSET + 16 * fmt.RECORD_SIZE), OFFSET, 16)
    with pytest.raises(TypeError):
        ring.begin(0, 0, *(1,) * 18)


def test_c_ring_is_built_wherever_a_compiler_is() -> None:
    """The extension is optional at install, so a broken build would only show up as slowness."""
    if shutil.which("cc") or shutil.which("gcc"):
        assert C_RING is not None, "a C compiler is present but nccl_doctor.capture._ring is not"
    else:
        assert not ring_mod.accelerated()


def test_pure_python_switch_selects_the_python_ring(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ring_mod.PURE_PYTHON_ENV, "1")
    assert not ring_mod.accelerated()
    assert isinstance(ring_mod.make_ring(bytearray(OFFSET + 16 * 128), OFFSET, 16), PyRing)
    monkeypatch.setenv(ring_mod.PURE_PYTHON_ENV, "0")
    assert ring_mod.accelerated() == (C_RING is not None)


@pytest.mark.parametrize("impl", ["python", pytest.param("c", marks=needs_c)])
def test_ring_publishes_its_count_at_the_counter_offset(impl: str) -> None:
    cls = PyRing if impl == "python" else C_RING
    buf = bytearray(OFFSET + 16 * fmt.RECORD_SIZE)
    ring = cls(buf, OFFSET, 16, 8)
    for n in range(1, 20):
        ring.begin(0, 0, *(1,) * 19)
        assert fmt.COUNTER.unpack_from(buf, 8)[0] == n == ring.count
    with pytest.raises(ValueError, match="counter does not fit"):
        cls(buf, OFFSET, 16, len(buf) - 4)


def test_progress_is_read_from_the_header_alone(tmp_path) -> None:
    from nccl_doctor.capture.reader import read_progress
    from nccl_doctor.capture.writer import CaptureWriter

    w = CaptureWriter(tmp_path / "rank00000.h.1.ndcap", {"rank": 0, "pid": 1}, capacity=16)
    assert read_progress(w.path) == ({"rank": 0, "pid": 1}, 0)
    for _ in range(3):
        w.end(w.begin((0, 0) + (1,) * 19), 1, 1)
    assert read_progress(w.path)[1] == 3
