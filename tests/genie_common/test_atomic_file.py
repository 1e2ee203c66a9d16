"""atomic_path: readers see the old file or the whole new one; a failed write leaves nothing behind."""

import pytest

from genie_common.atomic_file import atomic_path


@pytest.mark.parametrize("durable", [False, True])
def test_replaces_on_success(tmp_path, durable):
    target = tmp_path / "sub" / "f.bin"
    with atomic_path(target, durable=durable) as tmp:
        tmp.write_bytes(b"new")
        assert not target.exists()  # nothing visible until the block ends
    assert target.read_bytes() == b"new"
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]


def test_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "f.bin"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f.bin"]
