"""The blob stores: media bytes live here, never in the table.

`port` is the contract (the `BlobStore` Protocol, its errors and key rule),
`s3` and `local` the two adapters. The names are gathered here, so
`from store.blobs import BlobStore` reads as it always did.
"""

from store.blobs.local import LocalBlobStore, VerifiedUrl
from store.blobs.port import (
    ABANDONED_UPLOAD_DAYS,
    ABANDONED_UPLOAD_SECONDS,
    GLACIER_IR,
    MAX_KEY_BYTES,
    MAX_PARTS,
    STANDARD,
    BlobAccessDenied,
    BlobError,
    BlobNotFound,
    BlobStore,
    BlobTooLarge,
    BlobTooSmall,
    InvalidBlobKey,
    Part,
    PartsChanged,
    validate_key,
)
from store.blobs.s3 import ABORT_INCOMPLETE_UPLOADS_RULE, S3BlobStore, open_s3_blob_store

__all__ = [
    "ABANDONED_UPLOAD_DAYS",
    "ABANDONED_UPLOAD_SECONDS",
    "ABORT_INCOMPLETE_UPLOADS_RULE",
    "GLACIER_IR",
    "MAX_KEY_BYTES",
    "MAX_PARTS",
    "STANDARD",
    "BlobAccessDenied",
    "BlobError",
    "BlobNotFound",
    "BlobStore",
    "BlobTooLarge",
    "BlobTooSmall",
    "InvalidBlobKey",
    "LocalBlobStore",
    "Part",
    "PartsChanged",
    "S3BlobStore",
    "VerifiedUrl",
    "open_s3_blob_store",
    "validate_key",
]
