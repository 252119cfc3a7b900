"""The local data set: every layout read from real files, bad samples skipped, batches a function of their position."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from agent.data import LocalDataset, open_dataset
from agent.errors import AgentError, DataError
from common.exit_codes import ExitCode, exit_code_for


def _image(path: Path, color: tuple[int, int, int], size: tuple[int, int] = (10, 6)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, color).save(path)  # the suffix picks PNG or JPEG
    return path


def _truncated_png(path: Path) -> Path:
    noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(noise).save(path)  # noise: the pixel data is most of the file, so half cuts into it
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def _ids_dataset(tmp_path: Path, n: int, batch: int, *, holdout: float = 0.0, seed: int = 0) -> LocalDataset:
    """``n`` samples whose single feature is their own index, so a batch says which samples it holds."""
    path = tmp_path / "ids.npz"
    np.savez(path, x=np.arange(n, dtype=np.float64).reshape(n, 1), y=np.arange(n))
    return open_dataset(path, (batch, 1), holdout=holdout, seed=seed)


def _ids(x: torch.Tensor) -> list[int]:
    return [int(v) for v in x.flatten()]


# --- image folders --------------------------------------------------------------------------------------


def test_an_image_folder_is_decoded_to_rgb_chw_in_unit_range_with_classes_in_sorted_order(tmp_path) -> None:
    _image(tmp_path / "dog" / "a.png", (0, 0, 255))
    _image(tmp_path / "cat" / "b.jpg", (0, 255, 0))
    _image(tmp_path / "cat" / "a.png", (255, 0, 0), size=(3, 17))
    (tmp_path / "cat" / "notes.txt").write_text("not a sample")

    data = open_dataset(tmp_path, (1, 3, 8, 8), holdout=0)

    assert data.classes == ("cat", "dog")
    assert data.train_x.shape == (3, 3, 8, 8) and data.train_x.dtype == torch.float32
    assert data.train_y.tolist() == [0, 0, 1] and data.train_y.dtype == torch.int64
    assert data.skipped == 0 and data.holdout_x.shape == (0, 3, 8, 8)
    red, green, blue = data.train_x  # file order: cat/a.png, cat/b.jpg, dog/a.png
    assert torch.allclose(red[0], torch.ones(8, 8)) and red[1:].abs().max() == 0
    assert green[1].min() > 0.95 and green[[0, 2]].max() < 0.05  # JPEG is lossy, not that lossy
    assert torch.allclose(blue[2], torch.ones(8, 8)) and blue[:2].abs().max() == 0


def test_a_one_channel_sample_shape_reads_images_as_grey(tmp_path) -> None:
    _image(tmp_path / "only" / "a.png", (128, 128, 128))
    _image(tmp_path / "only" / "b.jpeg", (255, 255, 255), size=(40, 30))

    data = open_dataset(tmp_path, (2, 1, 5, 4), holdout=0)

    assert data.train_x.shape == (2, 1, 5, 4)
    assert torch.allclose(data.train_x[0], torch.full((1, 5, 4), 128 / 255))
    assert data.train_x[1].min() > 0.98


def test_corrupt_images_are_skipped_counted_and_named(tmp_path) -> None:
    for i in range(4):
        _image(tmp_path / "a" / f"{i}.png", (i, i, i))
    _truncated_png(tmp_path / "a" / "cut.png")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "x.png").write_text("this is text, not an image")

    data = open_dataset(tmp_path, (2, 3, 4, 4), holdout=0)

    assert len(data.train_x) == 4 and data.train_y.tolist() == [0, 0, 0, 0]
    assert data.skipped == 2 and data.classes == ("a", "b")
    assert [line.split(":")[0] for line in data.skipped_examples] == ["a/cut.png", "b/x.png"]
    assert "cannot identify image file" in data.skipped_examples[1]
    assert str(tmp_path) not in data.skipped_examples[1]  # the path is said once, before the colon
    assert "2 skipped: a/cut.png: " in data.describe()


def test_skipped_examples_stop_at_five_while_the_count_goes_on(tmp_path) -> None:
    _image(tmp_path / "a" / "good.png", (1, 2, 3))
    for i in range(7):
        (tmp_path / "a" / f"bad{i}.png").write_bytes(b"\x89PNG not really")

    data = open_dataset(tmp_path, (1, 3, 2, 2), holdout=0)

    assert data.skipped == 7 and len(data.skipped_examples) == 5


def test_more_skipped_than_allowed_is_refused(tmp_path) -> None:
    for i in range(3):
        _image(tmp_path / "a" / f"{i}.png", (i, i, i))
    (tmp_path / "a" / "bad.png").write_text("text")

    assert open_dataset(tmp_path, (1, 3, 2, 2), max_skipped_fraction=0.25).skipped == 1
    with pytest.raises(DataError, match=r"1 of 4 samples \(25%\).*max_skipped_fraction 0.2"):
        open_dataset(tmp_path, (1, 3, 2, 2), max_skipped_fraction=0.2)


def test_an_image_folder_needs_class_subfolders_and_an_image_shape(tmp_path) -> None:
    _image(tmp_path / "loose.png", (1, 2, 3))
    with pytest.raises(DataError, match="no class subfolders.*subfolder named for it"):
        open_dataset(tmp_path, (1, 3, 4, 4))
    _image(tmp_path / "a" / "0.png", (1, 2, 3))
    with pytest.raises(DataError, match="1 or 3 channels.*got a sample shape of 64"):
        open_dataset(tmp_path, (1, 64))


# --- arrays ---------------------------------------------------------------------------------------------


def test_npz_features_become_float32_and_integer_labels_int64(tmp_path) -> None:
    x = np.random.default_rng(0).normal(size=(10, 3, 2, 2))
    np.savez(tmp_path / "d.npz", x=x, y=np.arange(10, dtype=np.int32) % 3)

    data = open_dataset(tmp_path / "d.npz", (4, 3, 2, 2), holdout=0)

    assert data.train_x.dtype == torch.float32 and data.train_y.dtype == torch.int64
    assert torch.allclose(data.train_x, torch.from_numpy(x).float())
    assert data.train_y.tolist() == [0, 1, 2, 0, 1, 2, 0, 1, 2, 0] and data.classes == ()


def test_npz_inputs_and_targets_with_float_labels_and_flat_rows_reshaped(tmp_path) -> None:
    np.savez(tmp_path / "d.npz", inputs=np.arange(5 * 12).reshape(5, 12).astype(np.float64),
             targets=np.linspace(0, 1, 5))

    data = open_dataset(tmp_path / "d.npz", (2, 3, 4), holdout=0)

    assert data.train_x.shape == (5, 3, 4) and data.train_x[1, 0].tolist() == [12, 13, 14, 15]
    assert data.train_y.dtype == torch.float32 and data.train_y[-1] == 1.0  # regression targets stay floats


def test_integer_features_stay_integer_ids(tmp_path) -> None:
    np.savez(tmp_path / "tokens.npz", x=np.arange(24, dtype=np.int32).reshape(3, 8), y=np.array([0, 1, 0]))

    data = open_dataset(tmp_path / "tokens.npz", (1, 8), holdout=0)

    assert data.train_x.dtype == torch.int64 and data.train_x[2, 7] == 23


def test_a_pt_dict_and_a_pt_tuple_load_alike(tmp_path) -> None:
    x, y = torch.randn(6, 4, dtype=torch.bfloat16), torch.tensor([1, 0, 1, 1, 0, 0])
    torch.save({"x": x, "y": y}, tmp_path / "dict.pt")
    torch.save((x, y), tmp_path / "tuple.pt")
    torch.save({"inputs": x, "targets": y.float()}, tmp_path / "named.pt")

    by_dict, by_tuple = (open_dataset(tmp_path / name, (3, 4), holdout=0) for name in ("dict.pt", "tuple.pt"))
    named = open_dataset(tmp_path / "named.pt", (3, 4), holdout=0)

    assert by_dict.train_x.dtype == torch.float32 and torch.equal(by_dict.train_x, x.float())
    assert torch.equal(by_dict.train_x, by_tuple.train_x) and torch.equal(by_dict.train_y, by_tuple.train_y)
    assert by_dict.train_y.dtype == torch.int64 and named.train_y.dtype == torch.float32


def test_rows_of_the_wrong_shape_are_skipped(tmp_path) -> None:
    rows = [torch.full((2, 3), float(i)) for i in range(5)]
    rows[1], rows[3] = torch.zeros(2, 2), torch.zeros(7)
    torch.save({"x": rows, "y": torch.arange(5)}, tmp_path / "rows.pt")

    data = open_dataset(tmp_path / "rows.pt", (1, 2, 3), holdout=0)

    assert data.train_y.tolist() == [0, 2, 4] and data.train_x[:, 0, 0].tolist() == [0.0, 2.0, 4.0]
    assert data.skipped == 2
    assert data.skipped_examples[0] == "rows.pt: sample 1 has shape 2x2, the model takes 2x3 (6 values)"


def test_arrays_of_another_sample_shape_are_refused_naming_both_shapes(tmp_path) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 3, 28, 28)), y=np.zeros(4, dtype=int))
    with pytest.raises(DataError, match=r"d.npz: no usable samples, 4 skipped.*shape 3x28x28, the model takes 3x32x32"):
        open_dataset(tmp_path / "d.npz", (2, 3, 32, 32))


# --- CSV ------------------------------------------------------------------------------------------------


def test_csv_takes_the_label_column_by_name_and_skips_bad_rows(tmp_path) -> None:
    (tmp_path / "d.csv").write_text(
        "a,label,b,c\n"
        "1,0,2,3\n"
        "4,2,5,six\n"      # line 3: not a number
        "7,1,8,9\n"
        "1,1,2\n"          # line 5: a column short
        "\n"
        "0.5,2,0.25,0\n"
    )

    data = open_dataset(tmp_path / "d.csv", (1, 3), holdout=0)

    assert data.train_x.tolist() == [[1, 2, 3], [7, 8, 9], [0.5, 0.25, 0]] and data.train_x.dtype == torch.float32
    assert data.train_y.tolist() == [0, 1, 2] and data.train_y.dtype == torch.int64
    assert data.skipped_examples == ("d.csv: line 3: 'six' in column 'c' is not a number",
                                     "d.csv: line 5: 3 columns, the header has 4")


def test_csv_without_a_label_column_uses_the_last_and_reshapes_to_the_sample(tmp_path) -> None:
    (tmp_path / "d.csv").write_text("p,q,r,s,target\n1,2,3,4,0.5\n5,6,7,8,1.5\n")

    data = open_dataset(tmp_path / "d.csv", (2, 2, 2), holdout=0)

    assert data.train_x.shape == (2, 2, 2) and data.train_x[1].tolist() == [[5, 6], [7, 8]]
    assert data.train_y.dtype == torch.float32 and data.train_y.tolist() == [0.5, 1.5]


def test_csv_with_another_feature_count_is_refused(tmp_path) -> None:
    (tmp_path / "d.csv").write_text("a,b,label\n1,2,0\n")
    with pytest.raises(DataError, match=r"d.csv: 2 feature columns, but the model takes samples of 3 \(3 values\)"):
        open_dataset(tmp_path / "d.csv", (1, 3))


# --- whole-file problems --------------------------------------------------------------------------------


def _write_cases(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """Name -> (a broken data set, what its error must say)."""
    np.savez(tmp_path / "keys.npz", x=np.zeros((4, 2)), b=np.zeros(4))  # x without its y
    np.savez(tmp_path / "lengths.npz", x=np.zeros((4, 2)), y=np.zeros(3))
    np.savez(tmp_path / "small.npz", x=np.zeros((5, 2)), y=np.zeros(5))
    np.save(tmp_path / "single.npy", np.zeros((4, 2)))
    (tmp_path / "single.npy").rename(tmp_path / "single.npz")
    (tmp_path / "junk.npz").write_bytes(b"PK\x03\x04 not a zip at all")
    (tmp_path / "junk.pt").write_bytes(b"not a torch file")
    torch.save({"weights": torch.zeros(2)}, tmp_path / "keys.pt")
    torch.save(torch.zeros(4, 2), tmp_path / "tensor.pt")
    (tmp_path / "empty.csv").write_text("")
    (tmp_path / "data.tsv").write_text("1\t2\n")
    (tmp_path / "bad" / "a").mkdir(parents=True)
    (tmp_path / "bad" / "a" / "x.png").write_text("text")
    return {
        "missing": (tmp_path / "nope.npz", "no such file or folder; pass a folder of class subfolders"),
        "suffix": (tmp_path / "data.tsv", "unknown data format '.tsv'; pass a folder"),
        "npz keys": (tmp_path / "keys.npz", r"holds \['b', 'x'\], not arrays 'x' and 'y'.*numpy.savez"),
        "npz lengths": (tmp_path / "lengths.npz", "x has 4 samples but y has 3; give one label per sample"),
        "npy as npz": (tmp_path / "single.npz", "holds a single array.*numpy.savez"),
        "not a zip": (tmp_path / "junk.npz", "cannot read it as a NumPy .npz archive.*numpy.savez"),
        "not a pt": (tmp_path / "junk.pt", r"torch.load\(weights_only=True\) cannot read it.*torch.save"),
        "pt keys": (tmp_path / "keys.pt", r"keys \['weights'\], not 'x' and 'y'.*torch.save"),
        "pt tensor": (tmp_path / "tensor.pt", "holds a Tensor; save a dict"),
        "csv empty": (tmp_path / "empty.csv", "empty; the first row must name the columns"),
        "no usable": (tmp_path / "bad", "no usable samples, 1 skipped \\(e.g. a/x.png: cannot identify"),
        "small": (tmp_path / "small.npz", "leave 4 for training, fewer than one batch of 8; add samples"),
    }


@pytest.mark.parametrize("case", ["missing", "suffix", "npz keys", "npz lengths", "npy as npz", "not a zip",
                                  "not a pt", "pt keys", "pt tensor", "csv empty", "no usable", "small"])
def test_whole_file_problems_raise_a_data_error_naming_the_file_and_the_fix(tmp_path, case) -> None:
    path, says = _write_cases(tmp_path)[case]
    shape = (8, 3, 4, 4) if case == "no usable" else (8, 2)
    with pytest.raises(DataError, match=says) as raised:
        open_dataset(path, shape, holdout=0.2)
    assert str(raised.value).startswith(f"{path}: ")
    assert exit_code_for(raised.value) == ExitCode.BAD_FILE


def test_a_pt_file_that_would_run_code_is_refused(tmp_path) -> None:
    torch.save({"x": torch.zeros(4, 2), "y": torch.zeros(4), "extra": Path("x")}, tmp_path / "pickled.pt")
    with pytest.raises(DataError, match="weights_only=True"):
        open_dataset(tmp_path / "pickled.pt", (1, 2))


@pytest.mark.parametrize("kwargs", [{"holdout": 1.0}, {"holdout": -0.1}, {"seed": -1},
                                    {"max_skipped_fraction": 1.5}])
def test_arguments_out_of_range_are_usage_errors(tmp_path, kwargs) -> None:
    np.savez(tmp_path / "d.npz", x=np.zeros((4, 2)), y=np.zeros(4))
    with pytest.raises(AgentError) as raised:
        open_dataset(tmp_path / "d.npz", (1, 2), **kwargs)
    assert not isinstance(raised.value, DataError) and exit_code_for(raised.value) == ExitCode.USAGE


# --- batches and the held-out split ---------------------------------------------------------------------


def test_the_same_position_gives_the_same_batch_even_after_reopening(tmp_path) -> None:
    data = _ids_dataset(tmp_path, 23, 4, holdout=0.1, seed=7)
    first = data.batch(3, 2)
    data.batch(0, 0)  # another epoch in between
    again, reopened = data.batch(3, 2), _ids_dataset(tmp_path, 23, 4, holdout=0.1, seed=7).batch(3, 2)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert torch.equal(first[0], reopened[0]) and torch.equal(first[1], reopened[1])
    assert first[0].flatten().tolist() == first[1].float().tolist()  # inputs and labels stay paired


def test_each_epoch_visits_every_training_sample_once_in_its_own_order(tmp_path) -> None:
    data = _ids_dataset(tmp_path, 23, 4, holdout=0.1)
    train = set(_ids(data.train_x))
    assert len(train) == 21 and data.batches_per_epoch == 5  # 21 // 4, one sample dropped per epoch
    orders = []
    for epoch in range(4):
        seen = [i for index in range(data.batches_per_epoch) for i in _ids(data.batch(epoch, index)[0])]
        assert len(seen) == len(set(seen)) == 20 and set(seen) <= train
        assert all(len(data.batch(epoch, index)[0]) == 4 for index in range(data.batches_per_epoch))
        orders.append(seen)
    assert len({tuple(order) for order in orders}) == 4


def test_a_batch_past_the_epoch_is_an_index_error(tmp_path) -> None:
    data = _ids_dataset(tmp_path, 10, 3)
    data.batch(0, 2)
    with pytest.raises(IndexError, match="3 batches"):
        data.batch(0, 3)


def test_position_after_rolls_into_the_next_epoch(tmp_path) -> None:
    data = _ids_dataset(tmp_path, 10, 3)
    assert data.batches_per_epoch == 3
    assert data.position_after(0, 0) == (0, 1)
    assert data.position_after(0, 2) == (1, 0)
    assert data.position_after(4, 1) == (4, 2)


def test_the_holdout_is_disjoint_from_training_and_chosen_by_the_seed(tmp_path) -> None:
    held = {seed: _ids(_ids_dataset(tmp_path, 40, 2, holdout=0.25, seed=seed).holdout_x) for seed in (0, 1)}
    data = _ids_dataset(tmp_path, 40, 2, holdout=0.25, seed=0)
    train = _ids(data.train_x)
    assert len(held[0]) == 10 and not set(held[0]) & set(train) and sorted(held[0] + train) == list(range(40))
    assert _ids(_ids_dataset(tmp_path, 40, 2, holdout=0.25, seed=0).holdout_x) == held[0]
    assert held[1] != held[0]
    assert _ids(data.holdout_y) == held[0]  # labels travel with their samples


def test_a_small_holdout_still_holds_one_sample_and_none_holds_none(tmp_path) -> None:
    assert len(_ids_dataset(tmp_path, 10, 2, holdout=0.01).holdout_x) == 1
    assert len(_ids_dataset(tmp_path, 10, 2, holdout=0.0).holdout_x) == 0
    assert len(_ids_dataset(tmp_path, 2, 1, holdout=0.9).train_x) == 1  # training keeps at least one


def test_holdout_batches_cover_the_held_out_set_with_a_short_last_batch(tmp_path) -> None:
    data = _ids_dataset(tmp_path, 50, 4, holdout=0.2)
    batches = list(data.holdout_batches())
    assert [len(x) for x, _ in batches] == [4, 4, 2]
    assert torch.equal(torch.cat([x for x, _ in batches]), data.holdout_x)
    assert torch.equal(torch.cat([y for _, y in batches]), data.holdout_y)


def test_describe_says_how_many_samples_classes_held_out_and_skipped(tmp_path) -> None:
    for i in range(12):
        _image(tmp_path / ("a" if i % 2 else "b") / f"{i}.png", (i, i, i))
    (tmp_path / "a" / "z.png").write_text("text")
    data = open_dataset(tmp_path, (2, 3, 2, 2), holdout=0.1)
    assert data.describe() == (f"12 samples from 2 classes in {tmp_path} "
                               f"(1 held out, 1 skipped: a/z.png: cannot identify image file)")
    assert _ids_dataset(tmp_path, 1200, 8).describe() == f"1,200 samples in {tmp_path / 'ids.npz'} (0 held out)"


# --- token windows: .npy and .txt -----------------------------------------------------------------------


def _word_tokenizer(*sentences: str):
    """A word-level tokenizer trained here on ``sentences`` (id 0 is ``[UNK]``): a real ``tokenizers`` model."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(sentences, trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    return tokenizer


TEXT = "the cat sat on the mat\nthe dog sat on the log\n"  # 12 words


def test_a_token_stream_is_cut_into_non_overlapping_windows_of_the_length_plus_one(tmp_path) -> None:
    np.save(tmp_path / "ids.npy", np.arange(100, 123, dtype=np.int16))  # 23 tokens: 4 windows of 5, 3 left over

    data = open_dataset(tmp_path / "ids.npy", (2, 4), holdout=0, vocabulary=123)  # 122, the largest id, fits

    assert data.train_x.tolist() == [[100, 101, 102, 103], [105, 106, 107, 108],
                                     [110, 111, 112, 113], [115, 116, 117, 118]]
    assert data.train_y.tolist() == [[101, 102, 103, 104], [106, 107, 108, 109],
                                     [111, 112, 113, 114], [116, 117, 118, 119]]
    assert data.train_x.dtype == data.train_y.dtype == torch.int64
    assert data.batches_per_epoch == 2 and data.batch(0, 0)[0].shape == (2, 4)


def test_a_two_dimensional_array_is_one_window_per_row(tmp_path) -> None:
    np.save(tmp_path / "windows.npy", np.array([[7, 3, 9, 1], [2, 8, 8, 0], [5, 5, 6, 4]], dtype=np.uint16))

    data = open_dataset(tmp_path / "windows.npy", (3, 3), holdout=0)

    assert data.train_x.tolist() == [[7, 3, 9], [2, 8, 8], [5, 5, 6]]
    assert data.train_y.tolist() == [[3, 9, 1], [8, 8, 0], [5, 6, 4]]


def test_token_windows_are_split_and_batched_like_any_samples(tmp_path) -> None:
    np.save(tmp_path / "ids.npy", np.arange(200))  # 40 windows of 5 tokens, each token its own position

    data = open_dataset(tmp_path / "ids.npy", (4, 4), holdout=0.25, seed=3)
    again = open_dataset(tmp_path / "ids.npy", (4, 4), holdout=0.25, seed=3)

    starts = sorted(_ids(data.train_x[:, 0]) + _ids(data.holdout_x[:, 0]))
    assert starts == list(range(0, 200, 5)) and len(data.holdout_x) == 10  # every window once, a quarter held out
    assert data.batches_per_epoch == 7
    for epoch, index in [(0, 0), (2, 6), (5, 3)]:
        x, y = data.batch(epoch, index)
        assert torch.equal(x, again.batch(epoch, index)[0]) and torch.equal(y, again.batch(epoch, index)[1])
        assert torch.equal(y, x + 1)  # each target is the token after its input: pairs survive the shuffle
    assert torch.equal(data.holdout_y, data.holdout_x + 1)


def test_text_is_tokenized_by_the_named_tokenizer_and_cut_into_windows(tmp_path) -> None:
    tokenizer = _word_tokenizer(TEXT)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    ids = tokenizer.encode(TEXT, add_special_tokens=False).ids

    data = open_dataset(tmp_path / "corpus.txt", (1, 3), holdout=0, tokenizer=tmp_path / "tokenizer.json",
                        vocabulary=tokenizer.get_vocab_size())

    assert data.train_x.tolist() == [ids[0:3], ids[4:7], ids[8:11]]
    assert data.train_y.tolist() == [ids[1:4], ids[5:8], ids[9:12]]
    windows = [x + y[-1:] for x, y in zip(data.train_x.tolist(), data.train_y.tolist())]
    assert [tokenizer.decode(w) for w in windows] == ["the cat sat on", "the mat the dog", "sat on the log"]


def test_a_save_pretrained_folder_tokenizes_text_as_its_json_file_does(tmp_path) -> None:
    from transformers import PreTrainedTokenizerFast

    tokenizer = _word_tokenizer(TEXT)
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]",
                            model_max_length=16).save_pretrained(tmp_path / "folder")
    (tmp_path / "corpus.txt").write_text(TEXT * 30, encoding="utf-8")  # a stream far past model_max_length

    by_file = open_dataset(tmp_path / "corpus.txt", (2, 8), holdout=0, tokenizer=tmp_path / "tokenizer.json")
    by_folder = open_dataset(tmp_path / "corpus.txt", (2, 8), holdout=0, tokenizer=str(tmp_path / "folder"))

    assert len(by_file.train_x) == 40  # 360 words, 9 to a window
    assert torch.equal(by_file.train_x, by_folder.train_x) and torch.equal(by_file.train_y, by_folder.train_y)


def _token_cases(tmp_path: Path) -> dict[str, tuple[Path, dict, str]]:
    """Name -> (a token file, open_dataset's keywords, what its error must say); the model takes 1 x 4."""
    stream = np.arange(15)
    np.save(tmp_path / "short_rows.npy", np.zeros((3, 4), dtype=np.int64))
    np.save(tmp_path / "wide_rows.npy", np.zeros((3, 7), dtype=np.int64))
    np.save(tmp_path / "cube.npy", np.zeros((2, 2, 5), dtype=np.int64))
    np.save(tmp_path / "floats.npy", stream.astype(np.float32))
    np.save(tmp_path / "negative.npy", np.where(stream == 7, -3, stream))
    np.save(tmp_path / "outside.npy", np.where(stream == 12, 50, stream))
    np.save(tmp_path / "few.npy", np.arange(4))
    np.save(tmp_path / "objects.npy", np.array([1, "two"], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "archive.npz", ids=stream)
    (tmp_path / "archive.npz").rename(tmp_path / "archive.npy")
    np.save(tmp_path / "stream.npy", stream)
    (tmp_path / "corpus.txt").write_text(TEXT, encoding="utf-8")
    _word_tokenizer(TEXT).save(str(tmp_path / "tokenizer.json"))  # 8 tokens: [UNK] and 7 words
    (tmp_path / "broken.json").write_text("{not json")
    hint = "set data.tokenizer \\(the tokenizer= argument\\) to a tokenizers JSON file"
    return {
        "short rows": (tmp_path / "short_rows.npy", {}, "shape 3x4; .*shape n x 5; rows of only the model's "
                       "sequence length leave the last position without a next token"),
        "wide rows": (tmp_path / "wide_rows.npy", {}, "an array of shape 3x7; a token file holds a 1-D stream"),
        "cube": (tmp_path / "cube.npy", {}, "an array of shape 2x2x5; .*shape n x 5"),
        "floats": (tmp_path / "floats.npy", {}, "holds float32 values, not integer token ids"),
        "negative": (tmp_path / "negative.npy", {}, r"token id -3 \(window 1, position 2\) is negative"),
        "outside": (tmp_path / "outside.npy", {"vocabulary": 50}, r"token id 50 \(window 2, position 2\) is outside "
                    r"the model's vocabulary of 50 \(ids 0 to 49\); make the ids with the model's own tokenizer"),
        "few": (tmp_path / "few.npy", {}, "4 tokens, not one window of 5 tokens .*lower the sequence length"),
        "objects": (tmp_path / "objects.npy", {}, "cannot read it as a NumPy .npy array"),
        "archive": (tmp_path / "archive.npy", {}, "holds an archive of arrays, not one array of token ids"),
        "no tokenizer": (tmp_path / "corpus.txt", {}, f"a .txt file is split into token ids by a tokenizer, and "
                         f"none is given; {hint}"),
        "missing tokenizer": (tmp_path / "corpus.txt", {"tokenizer": tmp_path / "nope.json"},
                              f"no tokenizer at {tmp_path / 'nope.json'}; {hint}"),
        "broken tokenizer": (tmp_path / "corpus.txt", {"tokenizer": tmp_path / "broken.json"},
                             f"cannot load the tokenizer {tmp_path / 'broken.json'} \\(.*\\); {hint}"),
        "large tokenizer": (tmp_path / "corpus.txt", {"tokenizer": tmp_path / "tokenizer.json", "vocabulary": 5},
                            "has 8 tokens, more than the model's vocabulary of 5; set data.tokenizer"),
        "not a sequence": (tmp_path / "stream.npy", {"input_shape": (1, 2, 2)},
                           "token ids need a model input of batch x sequence length, e.g. 8x128"),
    }


@pytest.mark.parametrize("case", ["short rows", "wide rows", "cube", "floats", "negative", "outside", "few",
                                  "objects", "archive", "no tokenizer", "missing tokenizer", "broken tokenizer",
                                  "large tokenizer", "not a sequence"])
def test_bad_token_data_is_refused_naming_the_file_what_was_found_and_what_to_do(tmp_path, case) -> None:
    path, kwargs, says = _token_cases(tmp_path)[case]
    shape = kwargs.pop("input_shape", (1, 4))
    with pytest.raises(DataError, match=says) as raised:
        open_dataset(path, shape, holdout=0, **kwargs)
    assert str(raised.value).startswith(f"{path}: ")
    assert exit_code_for(raised.value) == ExitCode.BAD_FILE


def test_a_vocabulary_below_one_is_a_usage_error(tmp_path) -> None:
    np.save(tmp_path / "ids.npy", np.arange(10))
    with pytest.raises(AgentError, match="vocabulary must be a positive number") as raised:
        open_dataset(tmp_path / "ids.npy", (1, 4), vocabulary=0)
    assert not isinstance(raised.value, DataError)
