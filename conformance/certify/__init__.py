"""Certification bundles: a run that can be re-checked offline, anywhere.

Semantics, file layout and threat model: docs/certification.md.

    qconform certify --backend B [--out DIR] [--profile certification]   # run, then write the bundle
    qconform verify-bundle DIR [--deep] [--rerun N]                      # re-check it offline (and audit)

Modules, along the seams of the work:

- ``identity``: which suite wrote a bundle (versions, commit, ``suite_code_sha256``);
- ``codec``: the compact, lossless encoding of each case's output and intervals (outputs/*.safetensors);
- ``derive``: everything a bundle holds that follows from its results (counts, ``ok``, reports, ...);
- ``write``: ``certify`` (run in ``OUT.partial``, derive, seal, rename), ``add_files``;
- ``files``: reading a bundle's files safely (inside it, regular, bounded, streamed hashes);
- ``verify``: ``verify_bundle``; ``audit``: ``--rerun`` (re-execution of sampled cases);
- ``cli``: the two commands;
- ``dispatch``: ``CertificationStore``, the certifier of qconform_torch's certified dispatch.

Python API (docs/certification.md#python-api):

    from conformance.certify import CertifyOptions, certify, verify_bundle, add_files
    res = certify(["mykernel"], "bundle-dir", CertifyOptions(profile="smoke", schemes=["w8a8"]))
    res = certify(["mykernel"], "bundle-dir", profile="smoke", schemes=["w8a8"])  # the same: options as keywords
    res.ok, res.manifest_sha256, res.path
    v = verify_bundle("bundle-dir"); v.ok, v.problems
    add_files("bundle-dir", {"fingerprint.json": b"..."})   # extra/<name>, then re-seals MANIFEST.json
"""

from __future__ import annotations

from conformance.certify.cli import cmd_certify, cmd_verify_bundle, register
from conformance.certify.dispatch import CertificationError, CertificationStore
from conformance.certify.codec import StoredCase, pack_pair, unpack_pair, decode_case, encode_case, load_outputs
from conformance.certify.identity import BUNDLE_FORMAT, MANIFEST, describe_suite, suite_code_sha256, suite_identity, version_mismatch
from conformance.certify.verify import VerifyResult, offline_verdict, verify_bundle
from conformance.certify.write import CertifyOptions, CertifyResult, add_files, certify

__all__ = ["CertificationError", "CertificationStore", "BUNDLE_FORMAT", "MANIFEST", "CertifyOptions", "CertifyResult", "VerifyResult", "certify", "verify_bundle", "add_files",
           "StoredCase", "encode_case", "decode_case", "load_outputs", "offline_verdict", "register", "cmd_certify",
           "cmd_verify_bundle", "suite_code_sha256", "suite_identity", "describe_suite", "version_mismatch",
           "pack_pair", "unpack_pair"]
