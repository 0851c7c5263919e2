"""Checkpoints: atomic save, meta read without the arrays, load refuses another structure."""

import numpy as np
import pytest

from runner.lifecycle import checkpoint


def test_save_read_meta_and_load(tmp_path):
    state = {"a": np.arange(6.0).reshape(2, 3), "b": np.ones(4, np.int8)}
    meta = {"step": 7, "config_fingerprint": {"hash": "x", "config": {"seed": 1}}}
    checkpoint.save(tmp_path / "ckpt", state, meta)
    assert checkpoint.exists(tmp_path / "ckpt")
    assert checkpoint.read_meta(tmp_path / "ckpt") == meta
    loaded, got = checkpoint.load(tmp_path / "ckpt", state)
    assert got == meta
    np.testing.assert_array_equal(loaded["a"], state["a"])
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == ["state.npz"]


def test_load_refuses_another_shape(tmp_path):
    checkpoint.save(tmp_path, {"a": np.zeros(3)}, {"step": 1})
    with pytest.raises(ValueError, match="float64"):
        checkpoint.load(tmp_path, {"a": np.zeros(4)})


@pytest.mark.parametrize("damage", ["random", "truncated", "pickle"])
def test_unreadable_checkpoint_is_one_sentence_and_never_unpickled(tmp_path, damage):
    path = checkpoint.save(tmp_path, {"a": np.arange(100.0)}, {"step": 1})
    if damage == "random":
        path.write_bytes(np.random.default_rng(0).bytes(2048))
    elif damage == "truncated":
        path.write_bytes(path.read_bytes()[:200])
    else:  # a pickle NumPy would only read with allow_pickle=True
        import pickle
        path.write_bytes(pickle.dumps({"meta": 1}))
    for read in (lambda: checkpoint.read_meta(tmp_path), lambda: checkpoint.load(tmp_path, {"a": np.zeros(100)})):
        with pytest.raises(checkpoint.CorruptCheckpoint) as err:
            read()
        sentence = err.value.sentence()
        assert str(path) in sentence and "\n" not in sentence and "allow_pickle" not in sentence


def test_keeps_the_previous_and_falls_back_to_it(tmp_path, caplog):
    checkpoint.save(tmp_path, {"a": np.zeros(3)}, {"step": 1})
    checkpoint.save(tmp_path, {"a": np.ones(3)}, {"step": 2})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.npz", "state.prev.npz"]
    assert checkpoint.read_meta(tmp_path) == {"step": 2}
    (tmp_path / checkpoint.FILENAME).write_bytes(b"garbage")
    with caplog.at_level("WARNING"):
        state, meta = checkpoint.load(tmp_path, {"a": np.zeros(3)})
    assert meta == {"step": 1} and checkpoint.read_meta(tmp_path) == {"step": 1}
    np.testing.assert_array_equal(state["a"], np.zeros(3))
    assert str(tmp_path / checkpoint.FILENAME) in caplog.text and "previous" in caplog.text
    (tmp_path / checkpoint.FILENAME).unlink()
    assert checkpoint.exists(tmp_path) and checkpoint.read_meta(tmp_path) == {"step": 1}
