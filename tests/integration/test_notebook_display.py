"""A real stopped hang in a notebook (issue "The edges users meet"): executed headless by
nbclient, ``job.diagnose()`` and its root cause display as the report's HTML fragment with a
short line of text, and ``calls.waited_s`` counts the hung calls up to the stop."""

from __future__ import annotations

import html5lib
import nbclient
import nbformat
import pytest

import nccl_doctor
from nccl_doctor.capture.manifest import read_manifest
from nccl_doctor.reporters.html import FRAGMENT_CLASS

pytestmark = pytest.mark.integration


def test_the_hang_is_in_each_rank_s_wait(stopped_hang):
    run = stopped_hang("skip_broadcast")
    calls = nccl_doctor.open(run.sup.out_dir).calls
    hung = calls[calls["state"] == "entered"]
    assert len(hung) >= 2 and hung["duration_s"].isna().all()
    # blocked until the watchdog stopped the job: longer than any returned call, and never
    # past the job's end
    assert (hung["waited_s"] > 0.5).all(), hung[["rank", "op", "seq", "waited_s"]]
    ended = read_manifest(run.sup.out_dir).ended_at
    reached = hung["t_enter"].map(lambda t: t.value) + hung["waited_s"] * 1e9
    assert (reached <= ended * 1e9 + 1e6).all()
    per_rank = calls.groupby(["rank", "op"], observed=True)["waited_s"].sum()
    for row in hung.itertuples():
        assert per_rank.loc[(row.rank, row.op)] >= row.waited_s
    done = calls[calls["state"] != "entered"]
    assert (done["waited_s"] == done["duration_s"]).all()


def test_a_notebook_shows_the_report(stopped_hang, tmp_path):
    out = stopped_hang("skip_broadcast").sup.out_dir
    nb = nbformat.v4.new_notebook()
    opened = f"import nccl_doctor\njob = nccl_doctor.open({str(out)!r})"
    nb.cells = [nbformat.v4.new_code_cell(opened),
                nbformat.v4.new_code_cell("job.diagnose()"),
                nbformat.v4.new_code_cell("job.diagnose().root_cause"),
                nbformat.v4.new_code_cell(
                    'job.calls.groupby(["rank", "op"], observed=True)["waited_s"].sum()')]
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    shown = [next(o for o in cell.outputs if o.output_type == "execute_result").data
             for cell in nb.cells[1:]]
    diagnosis, root, waited = shown
    for data, start in ((diagnosis, "<Diagnosis hang: "),
                        (root, "<Finding error collective_mismatch (root cause) rank 1: ")):
        html, text = data["text/html"], data["text/plain"]
        assert html.lstrip().startswith(f'<div class="{FRAGMENT_CLASS}">'), html[:200]
        assert "collective_mismatch" in html and "skip_broadcast.py:" in html
        # nothing fetched, no script (the job's own text - `broadcast(t, src=0)` - is text)
        tree = html5lib.parse(html, namespaceHTMLElements=False)
        assert not [el for el in tree.iter() if el.tag in ("script", "link", "iframe", "img")
                    or {"src", "href"} & set(el.keys())]
        assert "http" not in html and "url(" not in html
        assert text.startswith(start) and "\n" not in text and len(text) <= 200, text
    assert "nccl-doctor report" in diagnosis["text/html"]
    assert "waited_s" in waited["text/plain"]
