"""Archived tree files: the stored node bytes come back verbatim, writes are write-once and atomic,
and a damaged file is refused with its name."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from gyre.trajectory import CallMeta, TrajectoryTree, get_profile, template_for_family
from gyre.trajectory import Message as ChatMessage
from gyre.trajectory.archive import (
    archived_trees,
    encode_archived_tree,
    load_archived_tree,
    read_archived_tree,
    tree_blobs,
    tree_path,
    write_archived_tree,
)
from gyre.trajectory.messages import Api, ModelRequest

META = {"execution_id": "g1-e00", "profile": "generic", "template": "chatml", "closed": "1", "num_calls": "2"}


def _tree() -> TrajectoryTree:
    tree = TrajectoryTree("g1-e00", template_for_family("chatml"), get_profile("generic"))
    for prompt in ("1+2", "1+3"):
        prepared = tree.prepare(ModelRequest(Api.ANTHROPIC, ("Add.",), (ChatMessage.text("user", prompt),)))
        ids = [*b"sum", 258]
        tree.commit(
            prepared, ids, [-0.5, -0.25, -0.125, -0.0625], CallMeta(request_id=prompt, policy_version=3)
        )
    return tree


def test_an_archived_tree_reads_back_node_for_node(tmp_path: Path) -> None:
    tree = _tree()
    path = write_archived_tree(tree_path(tmp_path, "g1-e00"), "g1-e00", META, tree_blobs(tree))
    archived = read_archived_tree(path)
    assert archived.execution_id == "g1-e00" and archived.meta == META
    assert archived.blobs == [blob for _, blob in sorted(tree_blobs(tree).items())]
    loaded = load_archived_tree(path)
    assert loaded.closed and loaded.profile.name == "generic"
    assert {i: (n.token_ids.tolist(), n.logprobs.tolist(), n.meta) for i, n in loaded.nodes.items()} == {
        i: (n.token_ids.tolist(), n.logprobs.tolist(), n.meta) for i, n in tree.nodes.items()
    }
    assert [leaf.node_id for leaf in loaded.leaves()] == [leaf.node_id for leaf in tree.leaves()]
    assert archived_trees(tmp_path) == {"g1-e00": path}


def test_a_written_archive_is_never_rewritten_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tree_path(tmp_path, "g1-e00")
    write_archived_tree(path, "g1-e00", META, tree_blobs(_tree()))
    first = path.read_bytes()
    write_archived_tree(path, "g1-e00", {**META, "num_calls": "99"}, {})  # a redelivery with other content
    assert path.read_bytes() == first
    assert [p.name for p in path.parent.iterdir()] == [path.name]
    assert encode_archived_tree("g1-e00", META, tree_blobs(_tree())) == first  # deterministic bytes


def test_a_damaged_archive_names_the_file(tmp_path: Path) -> None:
    good = encode_archived_tree("g1-e00", META, tree_blobs(_tree()))
    cases = {
        "not-gzip.tree.gz": b"plain bytes",
        "bad-magic.tree.gz": gzip.compress(b"SOMETHING ELSE\n{}\n"),
        "truncated.tree.gz": gzip.compress(gzip.decompress(good)[:-3]),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with pytest.raises(ValueError, match=name):
            read_archived_tree(tmp_path / name)


def test_execution_ids_that_cannot_name_a_file_are_refused(tmp_path: Path) -> None:
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="cannot name an archive file"):
            tree_path(tmp_path, bad)
