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
                out["cuda"] = digest(b"".join(_tensor_bytes(s) for s in cuda.get_rng_state_all()))
        except Exception:
            pass
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            name, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
            out["numpy"] = digest(keys.tobytes() + repr((name, pos, has_gauss, gauss)).encode())
        except Exception:
            pass
    random = sys.modules.get("random")
    if random is not None:
        version, words, gauss = random.getstate()
        out["python"] = digest(array.array("Q", words).tobytes() + repr(gauss).encode())
    return out


def _tensor_bytes(t: Any) -> bytes:
    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    try:
        return t.contiguous().numpy().tobytes()
    except Exception:  # no numpy, or a dtype numpy lacks
        return repr(t.tolist()).encode()


def row_digests(rows: Any) -> list[str]:
    """One hash per row: of a 2-D tensor (token ids), of strings, or of token-id lists."""
    if hasattr(rows, "dim"):  # a tensor
        if rows.dim() == 1:
            rows = rows.unsqueeze(0)
        return [digest(_tensor_bytes(r)) for r in rows]
    return [digest(_item_bytes(r)) for r in _iter(rows)]


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
