"""Tokenizers, the memmap writer, the sampler, and bad corpora."""
import hashlib
import json
import os
import re
import shutil

import numpy as np
import pytest

from scalelab.config import dataset_config
from scalelab.run.data import (
    BatchSampler,
    DataError,
    MemmapTokenWriter,
    file_sha256,
    prepare_dataset,
    source_files,
    synthetic_text_chunks,
    verify_tokens,
)
from scalelab.run.tokenizers import BPETokenizer, ByteTokenizer
from support import tiny_config
from support.data import _rewrite_in_place


def _cfg(**dataset):
    return dataset_config(tiny_config(dataset=dataset))


def test_byte_tokenizer_is_lossless():
    data = "héllo, wörld\n".encode()
    assert bytes(ByteTokenizer().encode_bytes(data).astype(np.uint8)) == data


def test_bpe_round_trip_and_vocab_size():
    text = b"".join(synthetic_text_chunks(100_000, seed=3)).decode()
    tok = BPETokenizer.train([text], vocab_size=400)
    assert tok.vocab_size == 400
    ids = tok.encode(text[:2000])
    assert tok.decode(ids) == text[:2000]
    assert len(ids) < 2000 / 1.5, "BPE should compress the text"


def test_synthetic_corpus_is_deterministic_and_structured():
    a = b"".join(synthetic_text_chunks(50_000, seed=7))
    assert a == b"".join(synthetic_text_chunks(50_000, seed=7))
    assert a != b"".join(synthetic_text_chunks(50_000, seed=8))
    counts = np.bincount(np.frombuffer(a, np.uint8), minlength=256)
    assert (counts > 0).sum() < 40, "a small alphabet, not uniform bytes"


def test_writer_round_trip_and_hash(tmp_path):
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 60_000, size=n).astype(np.uint16) for n in (10, 1000, 0, 77)]
    writer = MemmapTokenWriter(tmp_path / "x.bin", np.uint16)
    for c in chunks:
        writer.append(c)
    info = writer.commit()
    expected = np.concatenate(chunks)
    got = np.memmap(tmp_path / "x.bin", dtype=np.uint16, mode="r")
    assert np.array_equal(got, expected)
    assert info["sha256"] == hashlib.sha256(expected.tobytes()).hexdigest()
    assert not list(tmp_path.glob(".*tmp")), "temporary file left behind"


def test_prepare_text_folder_byte_and_meta(tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "b.txt").write_bytes(b"second file " * 300)
    (corpus / "a.txt").write_bytes(b"first file " * 300)
    meta = prepare_dataset(_cfg(source="text", path=str(corpus)), tmp_path / "out", seq_len=16, chunk_bytes=1000)
    train = np.memmap(tmp_path / "out" / "train.bin", dtype=meta["dtype"], mode="r")
    val = np.memmap(tmp_path / "out" / "val.bin", dtype=meta["dtype"], mode="r")
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 256 and meta["tokenizer"] == "byte"
    assert train.size + val.size == 6900 == meta["n_train_tokens"] + meta["n_val_tokens"]
    assert bytes(train[:11].astype(np.uint8)) == b"first file ", "files are read in sorted order"
    on_disk = json.loads((tmp_path / "out" / "meta.json").read_text())
    assert on_disk["sha256"]["train.bin"] == hashlib.sha256((tmp_path / "out" / "train.bin").read_bytes()).hexdigest()


def test_prepare_bpe(tmp_path):
    meta = prepare_dataset(_cfg(tokenizer="bpe", bpe_vocab_size=300, synthetic_bytes=50_000), tmp_path, seq_len=16)
    assert meta["tokenizer"] == "bpe" and meta["vocab_size"] == 300
    assert meta["max_token_id"] < 300
    assert (tmp_path / "tokenizer.json").exists()


def test_uint32_when_vocab_exceeds_uint16(tmp_path):
    src = tmp_path / "big.bin"
    np.arange(70_000, dtype=np.uint32).tofile(src)
    meta = prepare_dataset(_cfg(source="tokenized", path=str(src), tokenized_dtype="uint32", vocab_size=70_000),
                           tmp_path / "o", seq_len=16)
    assert meta["dtype"] == "uint32" and meta["vocab_size"] == 70_000
    # Above 65,536 a uint32 vocabulary is not inferred: it must be stated.
    with pytest.raises(DataError, match=r"big.bin read as uint32 .* token id 69999, an inferred vocabulary of 70,000"):
        prepare_dataset(_cfg(source="tokenized", path=str(src), tokenized_dtype="uint32"), tmp_path / "p", seq_len=16)


def test_uint16_corpus_read_as_uint32_is_refused(tmp_path):
    """A character-level uint16 corpus (65 symbols) read as uint32: its byte count divides by 4,
    and each pair of tokens becomes one id (a + 65536 b), a ~4M 'vocabulary'."""
    src = tmp_path / "shakespeare_char.bin"
    np.random.default_rng(0).integers(0, 65, 10_000).astype(np.uint16).tofile(src)
    with pytest.raises(DataError, match=r"shakespeare_char.bin read as uint32 \(dataset.tokenized_dtype\) holds token id \d+, "
                                        r"an inferred vocabulary of 4,\d{3},\d{3}.*dataset.tokenized_dtype: uint16"):
        prepare_dataset(_cfg(source="tokenized", path=str(src), tokenized_dtype="uint32"), tmp_path / "o", seq_len=16)
    assert not any((tmp_path / "o").glob("*.bin")) and not (tmp_path / "o" / "meta.json").exists()
    # Stating the vocabulary: an id at or above it is an error naming the file and the dtype.
    with pytest.raises(DataError, match=r"shakespeare_char.bin read as uint32 .* holds token id \d+ >= dataset.vocab_size=65"):
        prepare_dataset(_cfg(source="tokenized", path=str(src), tokenized_dtype="uint32", vocab_size=65), tmp_path / "p", seq_len=16)
    meta = prepare_dataset(_cfg(source="tokenized", path=str(src)), tmp_path / "q", seq_len=16)  # read as it was written
    assert meta["dtype"] == "uint16" and meta["vocab_size"] == 65


def test_a_special_file_is_not_a_corpus(tmp_path):
    with pytest.raises(DataError, match="corpus path /dev/null is a character device, a special file"):
        prepare_dataset(_cfg(source="text", path="/dev/null"), tmp_path / "o", seq_len=16)


def test_tokenized_folder_used_as_it_is(tmp_path):
    src = tmp_path / "nanogpt"
    src.mkdir()
    train = np.random.default_rng(1).integers(0, 50257, 5000).astype(np.uint16)
    val = np.random.default_rng(2).integers(0, 50257, 600).astype(np.uint16)
    train.tofile(src / "train.bin")
    val.tofile(src / "val.bin")
    meta = prepare_dataset(_cfg(source="tokenized", path=str(src), vocab_size=50257), tmp_path / "o", seq_len=16)
    assert np.array_equal(np.fromfile(tmp_path / "o" / "train.bin", np.uint16), train)
    assert np.array_equal(np.fromfile(tmp_path / "o" / "val.bin", np.uint16), val)
    assert meta["vocab_size"] == 50257


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"too short", "shorter than one sequence"),
])
def test_bad_text_corpus_names_the_file(tmp_path, content, message):
    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(content)
    with pytest.raises(DataError, match=message) as err:
        prepare_dataset(_cfg(source="text", path=str(corpus)), tmp_path / "o", seq_len=64)
    assert str(corpus) in str(err.value)
    assert not (tmp_path / "o" / "meta.json").exists()


def test_undecodable_bytes_strict_fails_with_offset_and_replace_works(tmp_path):
    corpus = tmp_path / "latin1.txt"
    corpus.write_bytes(b"abc " * 100 + b"caf\xe9 " + b"xyz " * 100)
    with pytest.raises(DataError, match=r"latin1.txt: byte 403 is not valid UTF-8"):
        prepare_dataset(_cfg(source="text", path=str(corpus), tokenizer="bpe", bpe_vocab_size=300), tmp_path / "o", seq_len=8)
    meta = prepare_dataset(_cfg(source="text", path=str(corpus), tokenizer="bpe", bpe_vocab_size=300,
                                decode_errors="replace"), tmp_path / "o", seq_len=8)
    assert meta["n_train_tokens"] > 0


def test_bin_size_not_multiple_of_dtype(tmp_path):
    src = tmp_path / "odd.bin"
    src.write_bytes(b"\x01\x00" * 100 + b"\x01")
    with pytest.raises(DataError, match=r"odd.bin has 201 bytes, not a multiple of 2"):
        prepare_dataset(_cfg(source="tokenized", path=str(src)), tmp_path / "o", seq_len=8)


def test_sampler_deterministic_disjoint_and_global(tiny_data):
    meta = json.loads((tiny_data / "meta.json").read_text())
    s = BatchSampler(tiny_data / "train.bin", meta["dtype"], seq_len=32, seed=5)
    a = s.batch(step=3, rank=1, batch_size=4, world_size=4)
    assert a.shape == (4, 33) and a.dtype == np.int64
    assert np.array_equal(a, BatchSampler(tiny_data / "train.bin", meta["dtype"], 32, 5).batch(3, 1, 4, 4))
    assert not np.array_equal(a, s.batch(step=4, rank=1, batch_size=4, world_size=4))
    starts = s.global_starts(3, 16)
    assert len(set(starts.tolist())) == 16, "windows of one step are distinct, so ranks are disjoint"
    per_rank = np.concatenate([s.batch(3, r, 4, 4) for r in range(4)])
    assert np.array_equal(per_rank, s.batch(3, 0, 16, 1)), "ranks together see exactly the global batch"
    tokens = np.memmap(tiny_data / "train.bin", dtype=meta["dtype"], mode="r")
    assert np.array_equal(a[0], tokens[starts[4]:starts[4] + 33]), "a row is a contiguous window"


def test_source_files_are_what_the_data_step_reads(tmp_path):
    """The workflow's inputs of prepare_data: every file read, never the folder itself."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / ".git").mkdir()
    for name in ("b.txt", "sub/a.txt", ".hidden.txt", ".git/HEAD"):
        (corpus / name).write_text("x")
    assert source_files(_cfg(source="text", path=str(corpus))) == [corpus / "b.txt", corpus / "sub" / "a.txt"]
    assert source_files(_cfg(source="text", path=str(corpus / "b.txt"))) == [corpus / "b.txt"]
    assert source_files(_cfg()) == []
    tokenized = tmp_path / "nanogpt"
    tokenized.mkdir()
    for name in ("train.bin", "val.bin", "meta.pkl", "input.txt"):
        (tokenized / name).write_bytes(b"\0\0")
    assert source_files(_cfg(source="tokenized", path=str(tokenized))) == [tokenized / "train.bin", tokenized / "val.bin"]
    (tokenized / "val.bin").unlink()
    with pytest.raises(DataError, match="lacks .*val.bin"):
        source_files(_cfg(source="tokenized", path=str(tokenized)))


def test_verify_tokens_cheap_check_then_sha256(tmp_path, tiny_data):
    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)  # copy2 keeps mtimes: the recorded size and mtime still hold
    meta = json.loads((data / "meta.json").read_text())
    assert set(meta["files"]["train.bin"]) == {"size", "mtime_ns"}
    assert verify_tokens(data, meta) is None
    _rewrite_in_place(data / "train.bin", lambda b: b)  # touched, same bytes: the sha256 still matches
    assert verify_tokens(data, meta) is None
    old_meta = {k: v for k, v in meta.items() if k != "files"}  # a meta.json of an earlier version
    assert verify_tokens(data, old_meta) is None
    _rewrite_in_place(data / "train.bin", lambda b: b[::-1])
    for m in (meta, old_meta):
        reason = verify_tokens(data, m)
        assert reason and str(data / "train.bin") in reason and "sha256" in reason and "prepare_data" in reason
    with open(data / "train.bin", "ab") as handle:
        handle.write(b"\0\0")
    assert "bytes, meta.json records" in verify_tokens(data, meta)
    (data / "train.bin").unlink()
    assert "is missing" in verify_tokens(data, meta)


def _replace(path, content: bytes, mtime_ns: int):
    """What `rsync -a` or `cp -p` does: another file renamed into place, carrying the sender's time."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.write_bytes(content)
    os.utime(tmp, ns=(mtime_ns, mtime_ns))
    tmp.replace(path)


@pytest.mark.parametrize("dataset, names", [
    ({"source": "text", "path": "corpus"}, ["corpus/a.txt", "corpus/b.txt"]),
    ({"source": "text", "path": "corpus", "tokenizer": "bpe", "bpe_vocab_size": 300}, ["corpus/a.txt", "corpus/b.txt"]),
    ({"source": "tokenized", "path": "nanogpt/train.bin"}, ["nanogpt/train.bin"]),
    ({"source": "tokenized", "path": "nanogpt"}, ["nanogpt/train.bin", "nanogpt/val.bin"]),
])
def test_meta_records_each_source_file(tmp_path, monkeypatch, dataset, names):
    """meta.json's source.files: each file the data step read, by the path the config gives,
    with its size and mtime and the sha256 of its bytes (hashed as they were read)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_bytes(b"first file " * 300)
    (tmp_path / "corpus" / "b.txt").write_bytes("second fïle ".encode() * 300)
    (tmp_path / "nanogpt").mkdir()
    for split, n in (("train", 3000), ("val", 500)):
        np.random.default_rng(n).integers(0, 256, n).astype(np.uint16).tofile(tmp_path / "nanogpt" / f"{split}.bin")
    meta = prepare_dataset(_cfg(**dataset), tmp_path / "out", seq_len=16, chunk_bytes=1000)
    files = meta["source"]["files"]
    assert list(files) == names
    for name in names:
        st = (tmp_path / name).stat()
        assert files[name] == {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                               "sha256": hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()}
    assert json.loads((tmp_path / "out" / "meta.json").read_text())["source"]["files"] == files
    assert "files" not in prepare_dataset(_cfg(), tmp_path / "synthetic", seq_len=16)["source"], "synthetic: no file"


def test_changed_sources_compares_content_whatever_the_time(tmp_path, monkeypatch):
    """Planning's check (changed_sources): other bytes are a change whatever their mtime says;
    same bytes under another time (touch, a copy) are not; a file is hashed only when its size
    and mtime differ from meta.json's record."""
    import scalelab.run.data as data

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_bytes(b"the quick brown fox " * 100)
    (corpus / "b.txt").write_bytes(b"pack my box with jugs " * 100)
    cfg = _cfg(source="text", path=str(corpus))
    out = tmp_path / "out"
    assert data.changed_sources(source_files(cfg), out) == [], "nothing prepared yet: nothing to compare"
    prepare_dataset(cfg, out, seq_len=16)
    hashed = []
    monkeypatch.setattr(data, "file_sha256", lambda path: hashed.append(path) or file_sha256(path))
    assert data.changed_sources(source_files(cfg), out) == [] and hashed == [], "size and mtime match: no hashing"

    a = corpus / "a.txt"
    original, mtime = a.read_bytes(), a.stat().st_mtime_ns
    os.utime(a)  # touched: a newer time, the same bytes
    assert data.changed_sources(source_files(cfg), out) == [] and hashed == [a]
    _replace(a, original, mtime - 3600 * 10**9)  # a copy of the same bytes, an older time
    assert data.changed_sources(source_files(cfg), out) == []

    _replace(a, original.upper(), mtime - 7200 * 10**9)  # another version, same size, an older time
    changes = data.changed_sources(source_files(cfg), out)
    assert len(changes) == 1 and re.fullmatch(rf"{a}: sha256 \w{{16}}\.\.\., the data was prepared from \w{{16}}\.\.\.", changes[0])
    _replace(a, original + b"more", mtime - 7200 * 10**9)
    assert data.changed_sources(source_files(cfg), out) == [f"{a}: {len(original) + 4} bytes, the data was prepared from {len(original)}"]
    _replace(a, original, mtime)

    (corpus / "b.txt").rename(corpus / "c.txt")
    assert data.changed_sources(source_files(cfg), out) == [
        f"{corpus / 'b.txt'}: read when the data was prepared, now gone",
        f"{corpus / 'c.txt'}: a new file, not read when the data was prepared"]

    # A meta.json of an earlier version records no source file: nothing to compare, nothing said.
    meta = json.loads((out / "meta.json").read_text())
    del meta["source"]["files"]
    (out / "meta.json").write_text(json.dumps(meta))
    assert data.changed_sources(source_files(cfg), out) == []


def test_mark_stale_dates_meta_back_to_1970(tmp_path, tiny_data):
    from scalelab.run.data import STALE_MTIME_NS, mark_stale

    data = tmp_path / "data"
    shutil.copytree(tiny_data, data)
    before = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in data.iterdir()}
    mark_stale(data)
    assert (data / "meta.json").stat().st_mtime_ns == STALE_MTIME_NS == 10**9, "older than any source, not 0 (ignored)"
    assert (data / "meta.json").read_bytes() == before["meta.json"][0]
    assert all((data / n).stat().st_mtime_ns == before[n][1] for n in ("train.bin", "val.bin")), "the tokens untouched"
