"""Short hashes of RNG states and generations. Reads only what the process already imported."""

from __future__ import annotations

import array
import hashlib
import sys
from typing import Any, Iterable

DIGEST_BYTES = 8  # 64 bits: a collision between two ranks' states is not a concern


def digest(data: bytes) -> str:
    return hashlib.blake2b(data, digest_size=DIGEST_BYTES).hexdigest()


def rng_fingerprint() -> dict[str, str]:
    """A hash of each random generator this process has: torch CPU, CUDA (only once CUDA is
    initialised: never initialise it), numpy's global state and Python's ``random``."""
    out: dict[str, str] = {}
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            out["torch"] = digest(_tensor_bytes(torch.random.get_rng_state()))
            cuda = torch.cuda
            if cuda.is_initialized():
                # this rank's device only: a rank sees every GPU but moves its own generator
                out["cuda"] = digest(_tensor_bytes(cuda.get_rng_state(cuda.current_device())))
        except Exception:
            pass
    # (``numpy.random`` is imported on first use of the attribute: a process that never used
    # it has no global state to read, and reading it would import it, 5-10 ms)
    np_random = sys.modules.get("numpy.random")
    if np_random is not None:
        try:
            name, keys, pos, has_gauss, gauss = np_random.get_state(legacy=True)
            out["numpy"] = digest(keys.tobytes() + repr((name, pos, has_gauss, gauss)).encode())
        except Exception:
            pass
    random = sys.modules.get("random")
    if random is not None:
        try:
            _version, words, gauss = random.getstate()
            out["python"] = digest(array.array("Q", words).tobytes() + repr(gauss).encode())
        except Exception:
            pass
    return out


def _tensor_bytes(t: Any) -> bytes:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    try:
        return t.contiguous().numpy().tobytes()
    except Exception:  # no numpy, or a dtype numpy lacks
        return repr(t.tolist()).encode()


def row_digests(rows: Any, limit: int | None = None) -> tuple[list[str], str, int]:
    """(a hash per row for the first ``limit`` rows, a hash of all rows, the number of rows) of
    a 2-D tensor (token ids), of strings, or of token-id lists."""
    if hasattr(rows, "dim"):  # a tensor: one copy to the CPU, then views
        t = rows.detach()
        t = (t.cpu() if t.device.type != "cpu" else t).contiguous()
        if t.dim() == 1:
            t = t.unsqueeze(0)
        n = t.shape[0]
        return ([digest(_tensor_bytes(t[i])) for i in range(n if limit is None else
                                                            min(n, limit))],
                digest(repr(tuple(t.shape)).encode() + _tensor_bytes(t)), n)
    each = [digest(_item_bytes(r)) for r in _iter(rows)]
    return (each if limit is None else each[:limit]), digest("".join(each).encode()), len(each)


def _iter(rows: Any) -> Iterable[Any]:
    if isinstance(rows, (str, bytes)):
        return [rows]
    return rows


def _item_bytes(item: Any) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode("utf-8", "surrogatepass")
    if hasattr(item, "dim"):
        return _tensor_bytes(item)
    return repr(list(item) if not isinstance(item, (int, float)) else item).encode()
