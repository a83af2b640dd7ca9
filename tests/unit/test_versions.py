
import pytest

from index_format.manifest import MANIFEST, IndexMismatch
from index_format.versions import (
    ACTIVE,
    activate,
    active_version,
    list_versions,
    publish,
    remove_version,
    resolve_version_dir,
    staging_dir,
)
from tests.conftest import fake_version


def _staged(root, key):
    return fake_version(staging_dir(root, key), key)


def test_publish_is_one_rename_and_activation_swaps_the_pointer(tmp_path):
    v1 = publish(_staged(tmp_path, "k1"), tmp_path, "v1")
    assert not staging_dir(tmp_path, "k1").exists() and (v1 / MANIFEST).is_file()
    assert active_version(tmp_path) is None
    with pytest.raises(IndexMismatch, match="no active index version; versions there: v1"):
        resolve_version_dir(tmp_path)
    activate(tmp_path, "v1")
    publish(_staged(tmp_path, "k2"), tmp_path, "v2")
    assert list_versions(tmp_path) == ["v1", "v2"] and active_version(tmp_path) == "v1"
    activate(tmp_path, "v2")
    assert (tmp_path / ACTIVE).read_text() == "v2\n"
    assert resolve_version_dir(tmp_path) == tmp_path / "versions" / "v2"
    assert resolve_version_dir(tmp_path, "v1") == tmp_path / "versions" / "v1"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == [".ACTIVE.lock"]  # no temp pointer left


def test_versions_are_kept_until_removed_and_the_active_one_is_protected(tmp_path):
    for k in ("a", "b"):
        publish(_staged(tmp_path, k), tmp_path, k)
    activate(tmp_path, "b")
    with pytest.raises(ValueError, match="active version"):
        remove_version(tmp_path, "b")
    remove_version(tmp_path, "a")
    assert list_versions(tmp_path) == ["b"]


def test_existing_names_and_unknown_versions_are_refused(tmp_path):
    publish(_staged(tmp_path, "k"), tmp_path, "v")
    with pytest.raises(FileExistsError):
        publish(_staged(tmp_path, "k2"), tmp_path, "v")
    with pytest.raises(IndexMismatch):
        activate(tmp_path, "nope")


def test_activations_are_logged_and_rollback_returns_to_the_one_before(tmp_path):
    from index_format.versions import activation_history, previous_version, rollback

    for key in ("v1", "v2", "v3"):
        publish(_staged(tmp_path, key), tmp_path, key)
    with pytest.raises(IndexMismatch, match="no earlier activation"):
        rollback(tmp_path)
    assert activate(tmp_path, "v1") is None
    assert activate(tmp_path, "v1") == "v1"  # already active: not logged again
    assert activate(tmp_path, "v2", by="api") == "v1"
    assert previous_version(tmp_path) == "v1"
    assert rollback(tmp_path) == ("v2", "v1") and active_version(tmp_path) == "v1"
    assert rollback(tmp_path) == ("v1", "v2")  # a second rollback undoes the first
    activate(tmp_path, "v3")
    assert [(e["version"], e["previous"], e["by"]) for e in activation_history(tmp_path)] == [
        ("v1", None, "cli"), ("v2", "v1", "api"), ("v1", "v2", "cli"), ("v2", "v1", "cli"), ("v3", "v2", "cli")]
    remove_version(tmp_path, "v2")
    with pytest.raises(IndexMismatch, match="removed"):
        rollback(tmp_path)


def test_activate_only_opens_published_names(tmp_path):
    publish(_staged(tmp_path, "v1"), tmp_path, "v1")
    (tmp_path / "versions" / "half").mkdir()  # no manifest: not a published version
    for name in ("../v1", "versions/v1", "half", ""):
        with pytest.raises(IndexMismatch):
            activate(tmp_path, name)
    assert active_version(tmp_path) is None


def test_activation_refuses_a_corrupted_version(tmp_path):
    for k in ("a", "b"):
        publish(_staged(tmp_path, k), tmp_path, k)
    activate(tmp_path, "a")
    (tmp_path / "versions" / "b" / "shards" / "shard-000" / "stray.bin").write_bytes(b"x")
    with pytest.raises(IndexMismatch, match="not activating 'b'.*not in manifest"):
        activate(tmp_path, "b")
    assert active_version(tmp_path) == "a"


def test_one_build_at_a_time_per_root(tmp_path):
    from index_format.versions import build_lock

    with build_lock(tmp_path), pytest.raises(IndexMismatch, match=r"another build is writing into .* \(pid \d+, started"), \
            build_lock(tmp_path):
        pass
    with build_lock(tmp_path):  # released when the first one ended
        pass


def test_a_version_being_served_cannot_be_removed_until_every_holder_lets_go(tmp_path):
    from index_format.versions import hold_version, let_go_version

    for k in ("a", "b"):
        publish(_staged(tmp_path, k), tmp_path, k)
    activate(tmp_path, "b")
    hold_version(tmp_path, "a")
    hold_version(tmp_path, "a")  # a second slot of this process serving it
    try:
        with pytest.raises(ValueError, match="served by 1 running process"):
            remove_version(tmp_path, "a")
        let_go_version(tmp_path, "a")
        with pytest.raises(ValueError, match="served by"):
            remove_version(tmp_path, "a")
    finally:
        let_go_version(tmp_path, "a")
    remove_version(tmp_path, "a")
    assert list_versions(tmp_path) == ["b"]
