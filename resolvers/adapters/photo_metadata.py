"""Location metadata out of a photo's own bytes, without touching its pixels.

:func:`strip_location` edits a photo file held in memory and keeps every byte
that is not location: the picture is not decoded or encoded again, so the
stored original stays exactly as good as the upload. Every edit keeps the
length of what it edits (an entry removed from an EXIF directory leaves zeros
behind, an XMP property leaves spaces), so no offset anywhere in the file has
to move. What goes:

- the EXIF GPS directory (tag 0x8825) and the pointer to it, wherever EXIF
  lives: a JPEG's APP1 segment, a HEIF/HEIC/AVIF ``Exif`` item, a PNG ``eXIf``
  chunk, a WebP ``EXIF`` chunk, a TIFF file's first directories;
- XMP location properties (``exif:GPS*``, ``photoshop:City``/``State``/
  ``Country``, the IPTC ``Location*`` and ``CountryCode`` ones, and any other
  ``GPS*``), blanked out with spaces, which XML allows between tags and
  attributes;
- IPTC location datasets (2:26, 2:27, 2:90, 2:92, 2:95, 2:100, 2:101) in a
  JPEG's Photoshop APP13 segment or a TIFF's IPTC tag, filled with spaces;
- anything after the last JPEG of a JPEG file (a motion photo's video, say):
  we do not read it, so it could carry a location. JPEGs that follow the first
  (the MPF images: gain maps, depth) are kept and cleaned the same way.

Pure bytes, no Pillow: the caller checks the result with Pillow.
"""

from __future__ import annotations

import hashlib
import re
import struct
import zlib
from collections.abc import Callable, Iterator

__all__ = ["LOCATION_XMP", "strip_location"]

GPS_IFD_TAG = 0x8825
_XMP_TAG = 700
_IPTC_TAG = 33723
# Bytes per value of each TIFF field type (BYTE, ASCII, SHORT, LONG, RATIONAL, SBYTE,
# UNDEFINED, SSHORT, SLONG, SRATIONAL, FLOAT, DOUBLE, IFD).
_TYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 1, 8: 2, 9: 4, 10: 8, 11: 4, 12: 8, 13: 4}
_MAX_IFDS = 8
_Reader = Callable[[int], int]  # reads an unsigned integer at an offset, in the TIFF's byte order

_LOCAL = (
    rb"(?:GPS|Gps)[A-Za-z0-9]*|City|State|Country|CountryCode|CountryName|Sublocation|ProvinceState"
    rb"|WorldRegion|Location(?:Created|Shown|Name|Id)?"
)
# Any namespace prefix, or none (a default namespace: `<GPSLatitude>`).
_PREFIX = rb"(?:[A-Za-z_][\w.-]*:)?"
_XMP_ELEMENT = re.compile(
    rb"<(?P<name>" + _PREFIX + rb"(?:" + _LOCAL + rb"))(?=[\s/>])[^>]*?(?:/>|>.*?</(?P=name)\s*>)", re.S
)
_XMP_ATTRIBUTE = re.compile(rb"(?<=\s)" + _PREFIX + rb"(?:" + _LOCAL + rb")\s*=\s*(?:\"[^\"]*\"|'[^']*')")
# What must not be left in any XMP packet of a cleaned photo.
LOCATION_XMP = re.compile(rb"[\s<]" + _PREFIX + rb"(?:GPS|Gps)[A-Za-z0-9]*(?=[\s=/>])")
_IPTC_LOCATION = frozenset({26, 27, 90, 92, 95, 100, 101})

_JPEG_SOI = b"\xff\xd8"
_EXIF_HEADER = b"Exif\x00\x00"
_XMP_HEADER = b"http://ns.adobe.com/xap/1.0/\x00"
_XMP_EXTENSION_HEADER = b"http://ns.adobe.com/xmp/extension/\x00"
_PHOTOSHOP_HEADER = b"Photoshop 3.0\x00"
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def strip_location(data: bytearray) -> bool:
    """Removes location metadata from a photo file's bytes, in place; True if any was found.

    Formats it does not know are left as they are, and so is whatever follows a
    structure that cannot be followed (a damaged file); the caller checks the result."""
    before = hashlib.blake2b(data).digest()  # not a copy: an original can be large
    try:
        if data.startswith(_JPEG_SOI):
            _strip_jpeg_file(data)
        elif data[4:8] == b"ftyp":
            _strip_bmff(data)
        elif data.startswith(_PNG_SIGNATURE):
            _strip_png(data)
        elif data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            _strip_webp(data)
        elif bytes(data[:4]) in (b"II*\x00", b"MM\x00*"):
            _strip_tiff(data, 0, len(data))
    except (struct.error, IndexError, ValueError):
        pass  # a damaged structure: what was cleaned before it stays cleaned
    return hashlib.blake2b(data).digest() != before


def _blank(data: bytearray, start: int, end: int, fill: bytes = b" ") -> None:
    data[start:end] = fill * (end - start)


# EXIF (TIFF structure) ---------------------------------------------------------------------------


def _strip_tiff(data: bytearray, base: int, end: int) -> bool:
    """Removes the GPS directory (and its pointer) from the TIFF structure at ``data[base:end]``."""
    if end - base < 8:
        return False
    order = {b"II": "<", b"MM": ">"}.get(bytes(data[base : base + 2]))
    if order is None or struct.unpack_from(order + "H", data, base + 2)[0] != 42:
        return False

    def u16(at: int) -> int:
        return int(struct.unpack_from(order + "H", data, at)[0])

    def u32(at: int) -> int:
        return int(struct.unpack_from(order + "I", data, at)[0])

    changed = False
    offset = u32(base + 4)
    seen: set[int] = set()
    while offset and offset not in seen and len(seen) < _MAX_IFDS:
        seen.add(offset)
        at = base + offset
        if at + 2 > end:
            break
        count = u16(at)
        entries = at + 2
        stop = entries + 12 * count + 4  # the entries, then the next directory's offset
        if stop > end:
            break
        index = 0
        while index < count:
            entry = entries + 12 * index
            tag = u16(entry)
            if tag == GPS_IFD_TAG:
                _wipe_directory(data, base, end, u32(entry + 8), u16, u32)
                # Drop the entry: the later ones and the next offset move up, zeros fill the end.
                data[entry : stop - 12] = data[entry + 12 : stop]
                _blank(data, stop - 12, stop, b"\x00")
                count -= 1
                stop -= 12
                struct.pack_into(order + "H", data, at, count)
                changed = True
                continue
            if tag in (_XMP_TAG, _IPTC_TAG):
                span = _value_span(data, base, end, entry, u16, u32)
                if span is not None:
                    strip = _strip_xmp if tag == _XMP_TAG else _strip_iim
                    changed = strip(data, *span) or changed
            index += 1
        offset = u32(entries + 12 * count)
    return changed


def _value_span(
    data: bytearray, base: int, end: int, entry: int, u16: _Reader, u32: _Reader
) -> tuple[int, int] | None:
    size = _TYPE_SIZES.get(u16(entry + 2), 1) * u32(entry + 4)
    start = entry + 8 if size <= 4 else base + u32(entry + 8)
    if start + size > end:
        return None
    return start, start + size


def _wipe_directory(data: bytearray, base: int, end: int, offset: int, u16: _Reader, u32: _Reader) -> None:
    """Zeros a directory and the values it points to."""
    at = base + offset
    if offset < 8 or at + 2 > end:
        return
    count = u16(at)
    stop = min(at + 2 + 12 * count + 4, end)
    for index in range(count):
        entry = at + 2 + 12 * index
        if entry + 12 > end:
            break
        size = _TYPE_SIZES.get(u16(entry + 2), 1) * u32(entry + 4)
        if size > 4:
            value = base + u32(entry + 8)
            if base + 8 <= value and value + size <= end:
                _blank(data, value, value + size, b"\x00")
    _blank(data, at, stop, b"\x00")


# XMP and IPTC ------------------------------------------------------------------------------------


def _strip_xmp(data: bytearray, start: int, end: int) -> bool:
    """Blanks location properties (elements and attributes) out of an XMP packet, with spaces."""
    packet = bytes(data[start:end])
    cleaned = _XMP_ELEMENT.sub(lambda m: b" " * len(m[0]), packet)
    cleaned = _XMP_ATTRIBUTE.sub(lambda m: b" " * len(m[0]), cleaned)
    if cleaned == packet:
        return False
    data[start:end] = cleaned
    return True


def _strip_iim(data: bytearray, start: int, end: int) -> bool:
    """Fills the location datasets of an IPTC-IIM block with spaces."""
    changed = False
    at = start
    while at + 5 <= end and data[at] == 0x1C:
        record, dataset, length = data[at + 1], data[at + 2], struct.unpack_from(">H", data, at + 3)[0]
        if length & 0x8000:
            return changed  # an extended length: not used for text, stop here
        value = at + 5
        if value + length > end:
            return changed
        if record == 2 and dataset in _IPTC_LOCATION and length:
            _blank(data, value, value + length)
            changed = True
        at = value + length
    return changed


def _strip_photoshop(data: bytearray, start: int, end: int) -> bool:
    """The IPTC block (resource 0x0404) of Photoshop image resources."""
    changed = False
    at = start
    while at + 12 <= end and data[at : at + 4] == b"8BIM":
        resource = struct.unpack_from(">H", data, at + 4)[0]
        name_length = data[at + 6]
        at += 6 + name_length + 1 + ((name_length + 1) % 2)
        if at + 4 > end:
            return changed
        size = struct.unpack_from(">I", data, at)[0]
        value = at + 4
        if value + size > end:
            return changed
        if resource == 0x0404:
            changed = _strip_iim(data, value, value + size) or changed
        at = value + size + (size % 2)
    return changed


# JPEG --------------------------------------------------------------------------------------------


def _strip_jpeg_file(data: bytearray) -> bool:
    changed = False
    at = 0
    while data.startswith(_JPEG_SOI, at):
        found = _strip_jpeg(data, at)
        if found is None:
            return changed  # not a stream we can follow: left as it is from here
        end, cleaned = found
        changed = changed or cleaned
        at = end
    with memoryview(data) as view:
        trailing = any(view[at:])
    if trailing:
        del data[at:]
        changed = True
    return changed


def _strip_jpeg(data: bytearray, start: int) -> tuple[int, bool] | None:
    """Cleans the metadata segments of the JPEG at ``start``; (the offset after its EOI, changed)."""
    n = len(data)
    at = start + 2
    changed = False
    while at < n:
        if data[at] != 0xFF:
            return None
        while at < n and data[at] == 0xFF:
            at += 1
        if at >= n:
            return None
        marker = data[at]
        at += 1
        if marker == 0xD9:  # EOI
            return at, changed
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            continue
        if at + 2 > n:
            return None
        length = struct.unpack_from(">H", data, at)[0]
        body, end = at + 2, at + length
        if length < 2 or end > n:
            return None
        if marker == 0xE1:
            changed = _strip_app1(data, body, end) or changed
        elif marker == 0xED and data.startswith(_PHOTOSHOP_HEADER, body):
            changed = _strip_photoshop(data, body + len(_PHOTOSHOP_HEADER), end) or changed
        at = end
        if marker == 0xDA:  # entropy-coded data up to the next marker
            at = _after_entropy_coded(data, at)
            if at < 0:
                return None
    return None


def _strip_app1(data: bytearray, body: int, end: int) -> bool:
    if data.startswith(_EXIF_HEADER, body):
        return _strip_tiff(data, body + len(_EXIF_HEADER), end)
    if data.startswith(_XMP_HEADER, body):
        return _strip_xmp(data, body + len(_XMP_HEADER), end)
    if data.startswith(_XMP_EXTENSION_HEADER, body):
        # a GUID (32) and two lengths (4 + 4) before the piece of the packet
        return _strip_xmp(data, body + len(_XMP_EXTENSION_HEADER) + 40, end)
    return False


def _after_entropy_coded(data: bytearray, at: int) -> int:
    while True:
        at = data.find(b"\xff", at)
        if at < 0 or at + 1 >= len(data):
            return -1
        following = data[at + 1]
        if following == 0x00 or 0xD0 <= following <= 0xD7:
            at += 2  # a stuffed 0xFF, or a restart marker
        elif following == 0xFF:
            at += 1  # fill bytes before a marker
        else:
            return at


# HEIF, HEIC, AVIF (ISO base media file format) ---------------------------------------------------


def _boxes(data: bytearray, start: int, end: int) -> Iterator[tuple[bytes, int, int]]:
    """(type, payload start, end) of each box in ``data[start:end]``."""
    at = start
    while at + 8 <= end:
        size = struct.unpack_from(">I", data, at)[0]
        kind = bytes(data[at + 4 : at + 8])
        header = 8
        if size == 1:
            if at + 16 > end:
                return
            size = struct.unpack_from(">Q", data, at + 8)[0]
            header = 16
        elif size == 0:
            size = end - at
        if size < header or at + size > end:
            return
        yield kind, at + header, at + size
        at += size


def _strip_bmff(data: bytearray) -> bool:
    meta = next(((body, end) for kind, body, end in _boxes(data, 0, len(data)) if kind == b"meta"), None)
    if meta is None:
        return False
    body, end = meta[0] + 4, meta[1]  # a full box: version and flags first
    children = {kind: (start, stop) for kind, start, stop in _boxes(data, body, end)}
    if b"iinf" not in children or b"iloc" not in children:
        return False
    kinds = _item_kinds(data, *children[b"iinf"])
    idat = children.get(b"idat")
    changed = False
    for item, (start, stop) in _item_extents(data, *children[b"iloc"], idat[0] if idat else None):
        kind = kinds.get(item)
        if stop > len(data) or start >= stop:
            continue
        if kind == b"Exif" and stop - start >= 4:
            tiff = start + 4 + struct.unpack_from(">I", data, start)[0]
            changed = _strip_tiff(data, tiff, stop) or changed
        elif kind == b"xmp":
            changed = _strip_xmp(data, start, stop) or changed
    return changed


def _item_kinds(data: bytearray, start: int, end: int) -> dict[int, bytes]:
    """Item id -> ``b"Exif"``, ``b"xmp"`` (an uncompressed XMP ``mime`` item) or its type."""
    version = data[start]
    first = start + 4 + (2 if version == 0 else 4)
    kinds: dict[int, bytes] = {}
    for kind, body, stop in _boxes(data, first, end):
        if kind != b"infe" or data[body] < 2:
            continue
        version = data[body]
        at = body + 4
        if version == 2:
            item = struct.unpack_from(">H", data, at)[0]
            at += 2
        else:
            item = struct.unpack_from(">I", data, at)[0]
            at += 4
        at += 2  # protection index
        item_type = bytes(data[at : at + 4])
        at += 4
        if item_type == b"mime":
            _, content_type, encoding = [*bytes(data[at:stop]).split(b"\x00"), b"", b""][:3]
            if content_type == b"application/rdf+xml" and not encoding:
                item_type = b"xmp"
        kinds[item] = item_type
    return kinds


def _item_extents(
    data: bytearray, start: int, end: int, idat: int | None
) -> Iterator[tuple[int, tuple[int, int]]]:
    """(item id, (start, end)) of every item stored in one extent, in the file or in ``idat``."""
    version = data[start]
    at = start + 4
    sizes = data[at], data[at + 1]
    offset_size, length_size = sizes[0] >> 4, sizes[0] & 15
    base_size, index_size = sizes[1] >> 4, (sizes[1] & 15) if version in (1, 2) else 0
    at += 2

    def read(size: int) -> int:
        nonlocal at
        value = int.from_bytes(data[at : at + size], "big") if size else 0
        at += size
        return value

    count = read(2 if version < 2 else 4)
    for _ in range(count):
        if at >= end:
            return
        item = read(2 if version < 2 else 4)
        method = read(2) & 15 if version in (1, 2) else 0
        read(2)  # data reference index
        base = read(base_size)
        extents = [(read(index_size), read(offset_size), read(length_size))[1:] for _ in range(read(2))]
        if len(extents) != 1 or method not in (0, 1) or (method == 1 and idat is None):
            continue
        offset, length = extents[0]
        origin = base + offset + (idat if method == 1 and idat is not None else 0)
        if length:
            yield item, (origin, origin + length)


# PNG and WebP ------------------------------------------------------------------------------------


def _strip_png(data: bytearray) -> bool:
    changed = False
    at = len(_PNG_SIGNATURE)
    while at + 12 <= len(data):
        length = struct.unpack_from(">I", data, at)[0]
        kind = bytes(data[at + 4 : at + 8])
        body, end = at + 8, at + 8 + length
        if end + 4 > len(data):
            break
        cleaned = False
        if kind == b"eXIf":
            start = body + len(_EXIF_HEADER) if data.startswith(_EXIF_HEADER, body) else body
            cleaned = _strip_tiff(data, start, end)
        elif kind == b"iTXt" and data.startswith(b"XML:com.adobe.xmp\x00", body):
            cleaned = _strip_png_xmp(data, body, end)
        if cleaned:
            struct.pack_into(">I", data, end, zlib.crc32(data[at + 4 : end]))
            changed = True
        if kind == b"IEND":
            break
        at = end + 4
    return changed


def _strip_png_xmp(data: bytearray, body: int, end: int) -> bool:
    at = body + len(b"XML:com.adobe.xmp\x00")
    compressed = data[at]
    at += 2
    for _ in range(2):  # language tag and translated keyword
        at = data.find(b"\x00", at, end) + 1
        if at == 0:
            return False
    if not compressed:
        return _strip_xmp(data, at, end)
    # A compressed packet cannot be edited in place: it becomes a comment of spaces if it has a location.
    try:
        packet = zlib.decompress(bytes(data[at:end]))
    except zlib.error:
        packet = b"GPS"  # unreadable: treated as if it had one
    if not (_XMP_ELEMENT.search(packet) or _XMP_ATTRIBUTE.search(packet) or b"GPS" in packet):
        return False
    data[body - 4 : body] = b"tEXt"
    data[body:end] = b"Comment\x00" + b" " * (end - body - 8)
    return True


def _strip_webp(data: bytearray) -> bool:
    changed = False
    at = 12
    while at + 8 <= len(data):
        kind = bytes(data[at : at + 4])
        size = struct.unpack_from("<I", data, at + 4)[0]
        body, end = at + 8, at + 8 + size
        if end > len(data):
            break
        if kind == b"EXIF":
            start = body + len(_EXIF_HEADER) if data.startswith(_EXIF_HEADER, body) else body
            changed = _strip_tiff(data, start, end) or changed
        elif kind == b"XMP ":
            changed = _strip_xmp(data, body, end) or changed
        at = end + (size % 2)
    return changed
