"""Conversion between integers and Roman numerals (1 to 3999)."""

# Symbols by value, largest first; to_roman takes each as often as it fits.
_NUMERALS = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]

_SYMBOLS = {"I": 1, "V": 5, "X": 10, "L": 50, "C": 100, "D": 500, "M": 1000}


def to_roman(number: int) -> str:
    """Return the Roman numeral of ``number`` (1 <= number <= 3999), e.g. 14 -> "XIV"."""
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= 3999:
        raise ValueError(f"cannot write {number!r} as a Roman numeral (1..3999 only)")
    parts = []
    for value, symbol in _NUMERALS:
        count, number = divmod(number, value)
        parts.append(symbol * count)
    return "".join(parts)


def from_roman(text: str) -> int:
    """Return the integer value of a Roman numeral, e.g. "XIV" -> 14."""
    if not text or any(ch not in _SYMBOLS for ch in text):
        raise ValueError(f"{text!r} is not a Roman numeral")
    total = 0
    for i, ch in enumerate(text):
        value = _SYMBOLS[ch]
        # A smaller symbol before a larger one is subtracted (IV = 4).
        if i + 1 < len(text) and value < _SYMBOLS[text[i + 1]]:
            total -= value
        else:
            total += value
    return total
