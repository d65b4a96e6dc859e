"""Secrets on a job's command line, replaced by ``***`` before nccl-doctor stores it.

The command lands in ``manifest.json``, ``report.json`` and (each rank's own ``sys.argv``) in
every ``.ndcap``: files users attach to bug reports. ``nccl-doctor run --no-redact`` (env
``NCCL_DOCTOR_NO_REDACT=1``) stores it verbatim. The environment is never stored, apart from the
few launcher variables listed in ``env.RECORDED_ENV``.

What is redacted, argument by argument:

- the value of a long flag whose name looks secret, in both forms: ``--api-key=X`` becomes
  ``--api-key=***``, ``--hf-token X`` becomes ``--hf-token ***``. The next argument is taken as
  the value only when it does not start with ``-`` (a flag that takes no value, followed by
  another flag, redacts nothing). Short flags (``-p X``) are never redacted: their meaning is
  the script's own.
- the value of ``NAME=X`` (``env HF_TOKEN=X ...``, Hydra's ``wandb.api_key=X``) whose NAME
  looks secret.
- the password in a URL: ``https://user:X@host/`` becomes ``https://user:***@host/``; and the
  value of a URL query parameter whose name looks secret (``?access_token=X``).

A name looks secret when, cut into lower-case words at ``-``, ``_``, ``.`` and camelCase
(``--wandb_api_key``: wandb, api, key), and not beginning with ``no`` (``--no-auth`` is a
switch), it has

- a word of ``SECRET_WORDS`` (``--client-secret``, ``--db-password``, ``--http-auth``);
- or ends in a word ending in ``token`` (``--token``, ``--hf-token``, ``--hub_token``,
  ``--authtoken``) that no word of ``TOKENIZER_WORDS`` precedes: ``--pad-token``,
  ``--eos-token`` name a tokenizer's tokens, not credentials;
- or ends in ``key`` right after a word of ``KEY_OWNERS`` (``--api-key``, ``--access-key``,
  ``--private-key``), since a bare ``--key``, ``--text-key``, ``--sort-key`` in a training
  script names a field, not a credential.

So ``--max-tokens 5``, ``--max-new-tokens``, ``--pad-token-id``, ``--tokenizer``, ``--keyboard``
and ``--author`` keep their values. The rule errs towards redacting: a wrong ``***`` costs a
detail of the stored command, a missed secret leaks it.
"""

from __future__ import annotations

import os
import re
from typing import Iterable, Mapping

from nccl_doctor import env

MASK = "***"
#: A name with any of these words looks secret.
SECRET_WORDS = (
    "secret", "secrets", "password", "passwd", "passphrase", "credential", "credentials",
    "auth", "authorization", "apikey", "accesskey", "privatekey", "secretkey",
    "signature", "sig",  # a signed URL's (?X-Amz-Signature=, Azure's ?sig=)
)
#: ``...key`` looks secret right after one of these words (``--api-key``, ``--aws_access_key``).
KEY_OWNERS = ("api", "access", "private", "secret", "signing", "encryption", "auth", "license")
#: ``...token`` right after one of these names a tokenizer's token, not a credential.
TOKENIZER_WORDS = ("pad", "eos", "bos", "unk", "sep", "cls", "mask", "special", "image", "start",
                   "end", "stop")

_FLAG = re.compile(r"--([A-Za-z0-9][A-Za-z0-9_.-]*)(=.*)?\Z", re.S)
_ASSIGN = re.compile(r"\+{0,2}([A-Za-z_][A-Za-z0-9_.-]*)=", re.S)
# (the password runs to the authority's last @: a password may hold one)
_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^/?#@:\s]*):[^/?#\s]*@")
_QUERY = re.compile(r"([?&;])([A-Za-z0-9_.-]+)=([^&;#\s]*)")
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the job asked for redaction (it did unless ``--no-redact`` set ``NO_REDACT``)."""
    return environ.get(env.NO_REDACT, "") != "1"


def wanted_here() -> bool:
    """``wanted`` in this process's environment (a rank's recorder: ``nccl-doctor run
    --no-redact`` sets it in the job's environment)."""
    return wanted(os.environ)


def words(name: str) -> list[str]:
    """``name`` cut into lower-case words (``--wandb_apiKey`` -> wandb, api, key)."""
    return [w for w in re.split(r"[^a-z0-9]+", _CAMEL.sub("_", name).lower()) if w]


def secret_name(name: str) -> bool:
    """Whether a flag, variable or parameter called ``name`` holds a secret (the module's
    rule)."""
    ws = words(name)
    if not ws or ws[0] == "no":
        return False
    if any(w in SECRET_WORDS for w in ws):
        return True
    last, before = ws[-1], ws[-2] if len(ws) > 1 else ""
    if last.endswith("token"):
        return before not in TOKENIZER_WORDS
    return last == "key" and before in KEY_OWNERS


def text(arg: str) -> str:
    """``arg`` with the secrets inside it masked: URL passwords, secret query parameters."""
    if "://" not in arg:
        return arg
    arg = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}:{MASK}@", arg)
    return _QUERY.sub(lambda m: f"{m.group(1)}{m.group(2)}={MASK}" if secret_name(m.group(2))
                      else m.group(0), arg)


def argv(args: Iterable[str]) -> list[str]:
    """``args`` (a command line) with every secret the module's rules name replaced by
    ``***``. Pure, and idempotent: redacting a redacted command changes nothing."""
    out: list[str] = []
    take_value = False  # the previous argument was a secret flag that awaits its value
    for arg in args:
        if take_value and not arg.startswith("-"):
            out.append(MASK)
            take_value = False
            continue
        take_value = False
        flag = _FLAG.match(arg)
        if flag is not None and secret_name(flag.group(1)):
            if flag.group(2) is None:
                take_value = True
                out.append(arg)
            else:
                out.append(f"--{flag.group(1)}={MASK}")
            continue
        assign = _ASSIGN.match(arg) if not arg.startswith("-") else None
        if assign is not None and secret_name(assign.group(1)):
            out.append(f"{assign.group(0)}{MASK}")
            continue
        out.append(text(arg))
    return out


# a name, an (in)equality or assignment, then a string literal: ``token = "hf_..."``,
# ``if api_key == 'x':``, ``{"password": "x"}``
_SOURCE_SECRET = re.compile(
    r"""(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<q>['"]?)\s*(?P<op>==|!=|=|:)\s*"""
    r"""(?P<lit>[rbuRBU]{0,2}(?P<quote>['"]))(?P<value>.*?)(?P=quote)""")


def source_line(line: str) -> str:
    """A line of a job's source as reports quote it (the branch on the rank, the user's line):
    a string literal given to, or compared with, a name that looks secret is masked, and so
    are URL passwords and secret query parameters (``text``)."""
    def mask(m: re.Match[str]) -> str:
        if not secret_name(m.group("name")):
            return m.group(0)
        whole, at = m.group(0), m.start(0)
        return whole[:m.start("value") - at] + MASK + whole[m.end("value") - at:]
    return text(_SOURCE_SECRET.sub(mask, line))
