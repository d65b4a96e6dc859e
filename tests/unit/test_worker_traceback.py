"""A distributed test's rank prints (and reports) the test's traceback: nccl-doctor's own frames
(its worker, the recorder's wrappers around torch's calls) and ``__tracebackhide__`` frames left
out, as pytest leaves them out."""

from __future__ import annotations

import os
import traceback

from nccl_doctor.testing.worker import _PACKAGE, trim

WRAPPER = os.path.join(_PACKAGE, "rank", "recorder", "a_wrapper.py")  # a file of the package


def _through_the_package():
    """A function whose frames are the package's, as the recorder's wrappers are."""
    ns: dict = {}
    exec(compile("def through(f):\n    return f()\n", WRAPPER, "exec"), ns)
    return ns["through"]


def _helper() -> None:
    __tracebackhide__ = True
    raise ValueError("boom")


def _failure(through) -> BaseException:
    def test_body() -> None:
        try:
            through(_helper)
        except ValueError as err:
            raise RuntimeError("while checking") from err

    try:
        through(test_body)
    except RuntimeError as err:
        return err
    raise AssertionError("test_body did not raise")


def test_the_packages_frames_and_hidden_ones_are_left_out() -> None:
    through = _through_the_package()
    text = "".join(traceback.format_exception(trim(_failure(through), __file__)))
    assert "in test_body" in text and "in _failure" in text, text
    assert "a_wrapper.py" not in text and "in _helper" not in text, text
    # the exception it was raised from is trimmed too, and both messages stay
    assert "ValueError: boom" in text and "RuntimeError: while checking" in text


def test_a_test_inside_the_package_keeps_its_own_frames() -> None:
    through = _through_the_package()
    text = "".join(traceback.format_exception(trim(_failure(through), WRAPPER)))
    assert "a_wrapper.py" in text and "in test_body" in text, text
