"""The CUDA build cache: filled only by trusted code, and a cached library used only if it is the
one that was built (its sha256 recorded beside it); a planted or swapped one is built again."""

from __future__ import annotations

import hashlib
import json

from optagent.worker.backends.cuda import verified_build


def test_a_cached_library_is_used_only_with_the_hash_it_was_built_with(tmp_path):
    lib, facts = tmp_path / "k.so", tmp_path / "k.facts.json"
    lib.write_bytes(b"\x7fELF built")
    facts.write_text(json.dumps({"sha256": hashlib.sha256(lib.read_bytes()).hexdigest(), "facts": []}))
    assert verified_build(lib, facts) == []
    lib.write_bytes(b"\x7fELF planted")  # swapped after the build
    assert verified_build(lib, facts) is None
    facts.write_text(json.dumps([]))  # a record from before hashes were kept, or a planted one without
    assert verified_build(lib, facts) is None
    facts.unlink()
    assert verified_build(lib, facts) is None
