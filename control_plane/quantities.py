"""Kubernetes resource quantities as ``specs/control-plane-api.yaml`` spells them.

CPU: ``"2"``, ``"500m"``, ``"1.5"``, ``1.5`` → normalized ``"2"`` / ``"1500m"``; no fractional millicores.
Memory and storage: ints or ``^\\d+(Ki|Mi|Gi|Ti|Pi|Ei)?$`` (decimal ``M``/``G`` are rejected) →
the largest exact IEC unit (``"512Mi"``) or plain bytes.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

_CPU = re.compile(r"^(\d*\.?\d+)(m)?$")
_MEM = re.compile(r"^(\d+)(Ki|Mi|Gi|Ti|Pi|Ei)?$")
_IEC = {"": 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "Pi": 1 << 50, "Ei": 1 << 60}


def cpu_millicores(value: str | int | float) -> int:
    """Parse a CPU quantity to millicores. Raises ``ValueError`` with a message a person can act on."""
    text = str(value).strip()
    match = _CPU.match(text)
    if not match:
        raise ValueError(f"CPU quantity {value!r}: use cores ('1', '1.5') or millicores ('500m')")
    number, milli = match.groups()
    try:
        amount = Decimal(number) * (1 if milli else 1000)
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only numbers
        raise ValueError(f"CPU quantity {value!r} is not a number") from exc
    if amount != amount.to_integral_value():
        raise ValueError(f"CPU quantity {value!r}: fractional millicores are not allowed")
    if amount <= 0:
        raise ValueError(f"CPU quantity {value!r} must be positive")
    return int(amount)


def format_cpu(millicores: int) -> str:
    return str(millicores // 1000) if millicores % 1000 == 0 else f"{millicores}m"


def memory_bytes(value: str | int) -> int:
    if isinstance(value, bool):
        raise ValueError(f"memory quantity {value!r} is not a number")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"memory quantity {value!r} must be positive")
        return value
    text = str(value).strip()
    match = _MEM.match(text)
    if not match:
        raise ValueError(
            f"memory/storage quantity {value!r}: use bytes or an IEC unit (Ki, Mi, Gi, Ti); "
            "decimal units like 'M' or 'G' are not accepted"
        )
    number, unit = match.groups()
    amount = int(number) * _IEC[unit or ""]
    if amount <= 0:
        raise ValueError(f"memory/storage quantity {value!r} must be positive")
    return amount


def format_memory(amount: int) -> str:
    for unit in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki"):
        if amount % _IEC[unit] == 0:
            return f"{amount // _IEC[unit]}{unit}"
    return str(amount)
