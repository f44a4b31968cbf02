"""Recognise bodies that are not text whatever their Content-Type says (images, archives, PDFs...)."""

from __future__ import annotations

# Leading bytes of common binary formats (WHATWG MIME sniffing, file(1) magic). Only signatures no text starts
# with; other binaries carry NUL and control bytes, which the ratio test below catches.
BINARY_SIGNATURES = (
    b"\x89PNG\r\n\x1a\n",
    b"GIF87a",
    b"GIF89a",
    b"\xff\xd8\xff",  # JPEG
    b"%PDF-",
    b"PK\x03\x04",  # zip, docx, jar
    b"\x1f\x8b",  # gzip
    b"\xfd7zXZ\x00",
    b"7z\xbc\xaf\x27\x1c",
    b"Rar!\x1a\x07",
    b"\x7fELF",
    b"wOFF",
    b"wOF2",
    b"OggS",
    b"\x1aE\xdf\xa3",  # Matroska / WebM
)
_TEXT_BOMS = (b"\xef\xbb\xbf", b"\xff\xfe", b"\xfe\xff")
_CONTROL = bytes(range(0x00, 0x09)) + b"\x0b" + bytes(range(0x0E, 0x1A)) + bytes(range(0x1C, 0x20))


def looks_binary(body: bytes, sample: int = 1024) -> bool:
    """True when the first bytes are a binary signature or mostly control bytes.

    Text in any ASCII-compatible charset has almost no C0 control bytes; UTF-16 (which has many NULs)
    announces itself with a BOM, so a body with a text BOM is text.
    """
    head = body[:sample]
    if not head or head.startswith(_TEXT_BOMS):
        return False
    if head.startswith(BINARY_SIGNATURES):
        return True
    controls = len(head) - len(head.translate(None, _CONTROL))
    return b"\x00" in head or controls > len(head) * 0.1
