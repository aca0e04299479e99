"""What a bake puts into an image from a harness tree: files as files, links as links, nothing from outside the tree."""

from __future__ import annotations

import io
import os
import tarfile

from fleetbench.bake import _add_tree, tree_hash


def harness_tree(tmp_path):
    secret = tmp_path / "worker-secret"
    secret.write_text("TOKEN-of-the-worker")
    tree = tmp_path / "harness"
    (tree / "sub").mkdir(parents=True)
    (tree / "run.py").write_text("print('hi')\n")
    (tree / "sub" / "model.py").write_text("x = 1\n")
    os.symlink(secret, tree / "creds.txt")  # a link out of the tree, to a file of the worker
    os.symlink(tmp_path, tree / "up")  # a link to a folder above the tree
    os.symlink("run.py", tree / "main.py")  # a link inside the tree
    os.mkfifo(tree / "pipe")  # neither file nor link: left out, never read (it would block)
    return tree, secret


def baked(tree) -> tarfile.TarFile:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        _add_tree(tar, tree, "/opt/harness")
    raw = buf.getvalue()
    assert b"TOKEN-of-the-worker" not in raw
    return tarfile.open(fileobj=io.BytesIO(raw))


def test_links_are_baked_as_links_and_never_followed(tmp_path):
    tree, secret = harness_tree(tmp_path)
    members = {m.name: m for m in baked(tree).getmembers()}
    assert sorted(members) == ["opt/harness/creds.txt", "opt/harness/main.py", "opt/harness/run.py",
                               "opt/harness/sub/model.py", "opt/harness/up"]
    assert members["opt/harness/creds.txt"].issym() and members["opt/harness/creds.txt"].linkname == str(secret)
    assert members["opt/harness/up"].issym() and members["opt/harness/main.py"].linkname == "run.py"
    assert members["opt/harness/run.py"].isfile() and members["opt/harness/run.py"].size == len("print('hi')\n")


def test_the_bake_identity_follows_link_targets_not_the_files_behind_them(tmp_path):
    tree, secret = harness_tree(tmp_path)
    before = tree_hash(tree)
    secret.write_text("another token")  # outside the tree: not an input of the bake
    assert tree_hash(tree) == before
    (tree / "creds.txt").unlink()
    os.symlink("/etc/other", tree / "creds.txt")  # the link itself changed: a new bake
    assert tree_hash(tree) != before


def test_a_file_and_a_folder_holding_only_that_file_are_two_bakes(tmp_path):
    """`copy: [{src: h, dest: /opt/h}]` with h/run.sh, and `copy: [{src: h/run.sh, dest: /opt/h}]`: the same tree
    hash, one inputs hash and tag, two layouts in the image (/opt/h/run.sh and /opt/h): a cache hit reused the other."""
    from types import SimpleNamespace

    from fleetbench.bake import copy_inputs, inputs_hash

    (tmp_path / "h").mkdir()
    (tmp_path / "h" / "run.sh").write_text("echo hi\n")
    spec = SimpleNamespace(dest="/opt/h")
    folder = copy_inputs([(spec, tmp_path / "h")])
    single = copy_inputs([(spec, tmp_path / "h" / "run.sh")])
    assert tree_hash(tmp_path / "h") == tree_hash(tmp_path / "h" / "run.sh")  # why the kind must count
    assert folder == [{"dest": "/opt/h", "sha256": tree_hash(tmp_path / "h")}]  # a folder's inputs as before
    assert inputs_hash("sha256:b", folder, None, [], "none") != inputs_hash("sha256:b", single, None, [], "none")
