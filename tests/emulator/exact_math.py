"""Test helper: exact powers of two and floor(log2) of rationals (an oracle independent of the emulator)."""

from fractions import Fraction


def p2(k: int) -> Fraction:
    return Fraction(2) ** k


def floor_log2(a: Fraction) -> int:
    e = a.numerator.bit_length() - a.denominator.bit_length()
    while p2(e) > a:
        e -= 1
    while p2(e + 1) <= a:
        e += 1
    return e
