"""CRC-32C (Castagnoli) and TFRecord's masked variant.

Uses the native ``google_crc32c`` package when installed (hardware instructions); otherwise a
table-driven pure-Python fallback. The write path of tensor event files only ever checksums
8-byte record headers (the payload footer is smdebug's constant), so the fallback is cheap there.
"""

from __future__ import annotations

__all__ = ["crc32c", "masked_crc32c", "MAGIC_FOOTER"]


def _make_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _make_table()


def _crc32c_python(data: bytes | memoryview) -> int:
    crc = 0xFFFFFFFF
    table = _TABLE
    for byte in bytes(data):
        crc = table[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


try:  # pragma: no cover - depends on the environment
    import google_crc32c as _native

    def crc32c(data: bytes | memoryview) -> int:
        """CRC-32C of ``data``."""
        return int(_native.value(bytes(data) if isinstance(data, memoryview) else data))

except ImportError:  # pragma: no cover
    crc32c = _crc32c_python


def masked_crc32c(data: bytes | memoryview) -> int:
    """TFRecord's masked CRC: rotate right by 15 bits and add a constant."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# smdebug writes this constant (masked_crc32c(b"0x12345678")) instead of the payload CRC and its
# reader insists on it, so we write it too; our reader accepts it or the real payload CRC.
MAGIC_FOOTER = masked_crc32c(b"0x12345678")
assert MAGIC_FOOTER == 0x062DC0B3
