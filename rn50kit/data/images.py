"""How the kit judges one image, the same wherever an image comes in: a record's payload (tools/check_dataset.py),
a file to pack (tools/prepare_folder.py) and a file to predict (--mode pred, predict.load_image). An image that is
refused gets its reason, (kind, detail): the packer lists it as left out, prediction writes it in the row's error
column. Only OpenCV and numpy."""
import struct

import cv2
import numpy as np

# the names searched for images (a folder to pack or to predict); GIF is looked at to be refused by name, not
# passed over without a word (OpenCV here has no GIF decoder, nor has DALI)
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp", ".ppm", ".pgm", ".gif")


def image_format(data):
    if data[:3] == b"\xff\xd8\xff":
        return "JPEG"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "PNG"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "GIF"
    if data[:2] == b"BM":
        return "BMP"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[:4] in (b"II*\0", b"MM\0*"):
        return "TIFF"
    return "unknown"


def jpeg_components(data):
    """Colour components in the JPEG's frame header (1 grayscale, 3 YCbCr/RGB, 4 CMYK/YCCK), or None."""
    pos = 2
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            return None
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            pos += 2
            continue
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # SOFn: P, Y, X, Nf
            return data[pos + 9] if pos + 9 < len(data) else None
        pos += 2 + length
    return None


def judge_image(image, limits=None, keep_decoded=False):
    """(errors, warnings, info) of one encoded image; each problem is (kind, detail). ``limits``: (shortest side,
    longest side, aspect ratio) beyond which the size is warned about. info: "format", "size" (width, height),
    "reencode" (not a JPEG, or CMYK: pack it re-encoded), and with ``keep_decoded`` "decoded" (OpenCV's BGR)."""
    errors, warnings = [], []
    info = {"size": None, "format": None, "reencode": False}
    if not image:
        return [("empty file", "0 bytes")], warnings, info
    kind = info["format"] = image_format(image)
    # libjpeg decodes a truncated JPEG with only a warning, so look for the end-of-image marker.
    if kind == "JPEG" and image.rfind(b"\xff\xd9", max(0, len(image) - 4096)) < 0:
        return [("truncated image", f"JPEG of {len(image)} bytes has no end-of-image marker")], warnings, info
    decoded = cv2.imdecode(np.frombuffer(image, np.uint8), cv2.IMREAD_COLOR)
    if decoded is None or decoded.size == 0:  # an error only: there is nothing to re-encode (--fix drops it)
        if kind == "GIF":
            return [("unsupported image", "GIF, which the kit's decoders (OpenCV, DALI) do not read; convert it to "
                                          "PNG or JPEG")], warnings, info
        return [("undecodable image", f"{kind} data of {len(image)} bytes does not decode (OpenCV)")], warnings, info
    if kind == "JPEG":
        components = jpeg_components(image)
        if components == 4:
            warnings.append(("CMYK JPEG", "4-component (CMYK/YCCK) JPEG; re-encode it as RGB (--fix)"))
            info["reencode"] = True
        elif components == 1:
            warnings.append(("grayscale JPEG", "1-component JPEG (decoded as gray RGB)"))
    else:
        warnings.append(("not a JPEG", f"{kind} image; re-encode it as JPEG (--fix)"))
        info["reencode"] = True
    height, width = decoded.shape[:2]
    info["size"] = (width, height)
    if limits:
        short, long_ = min(width, height), max(width, height)
        if short < limits[0] or long_ > limits[1] or long_ / short > limits[2]:
            warnings.append(("unusual size", f"{width}x{height}"))
    if keep_decoded:
        info["decoded"] = decoded
    return errors, warnings, info


def judge_image_file(path, limits=None, keep_decoded=False):
    """judge_image of the file at ``path``; a file that cannot be read is an error too ("unreadable file")."""
    try:
        with open(path, "rb") as f:
            image = f.read()
    except OSError as error:
        return [("unreadable file", error.strerror or str(error))], [], {"size": None, "format": None,
                                                                        "reencode": False}
    return judge_image(image, limits, keep_decoded)
