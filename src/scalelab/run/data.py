"""Data memmapping: corpus -> tokens -> ``{train,val}.bin`` (np.memmap) + ``meta.json``.

Sources: a deterministic synthetic corpus, a user's text file/folder, or an already
tokenized nanoGPT-style ``.bin``. Everything streams in bounded chunks, so a corpus
larger than memory is prepared with bounded memory. Each chunk of tokens is split into a
train part and a val part (the last ``val_fraction`` of the chunk), which spreads the
validation set over the whole corpus without knowing its length ahead of time.
"""
from __future__ import annotations

import codecs
import datetime
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from scalelab import __version__
from scalelab.config import DatasetConfig
from scalelab.io import write_json
from scalelab.run.tokenizers import BPETokenizer, ByteTokenizer

CHUNK_BYTES = 16 * 1024 * 1024  # text read per chunk; bounds memory use of the writer


class DataError(ValueError):
    """Unusable input data; the message names the file."""


# ----------------------------------------------------------------------------- sources


def synthetic_text_chunks(n_bytes: int, seed: int, chunk_bytes: int = 1 << 20) -> Iterator[bytes]:
    """A deterministic corpus with learnable structure (not uniform noise).

    A lexicon of made-up words and a first-order Markov chain over them: each word has a
    few likely successors with Zipf weights, sentences end with '.' and lines with '\\n'.
    A byte-level model first learns the spelling of words (loss falls from ln 256 ~ 5.5
    to ~2.5 within a few hundred steps), then the successor statistics.
    """
    rng = np.random.default_rng(seed)
    n_words, n_successors = 400, 6
    letters = np.frombuffer(b"etaoinshrdlcumwfgypbvkjxqz", dtype=np.uint8)
    letter_p = 1.0 / np.arange(1, len(letters) + 1)
    letter_p /= letter_p.sum()
    lexicon = [
        bytes(rng.choice(letters, size=rng.integers(2, 8), p=letter_p)) for _ in range(n_words)
    ]
    successors = rng.integers(0, n_words, size=(n_words, n_successors))
    succ_p = 1.0 / np.arange(1, n_successors + 1) ** 1.5
    succ_p /= succ_p.sum()
    written, word = 0, 0
    while written < n_bytes:
        # Draw the chain's randomness per block, vectorised; the walk itself is a cheap loop.
        block = 8192
        choices = rng.choice(n_successors, size=block, p=succ_p)
        punct = rng.random(block)
        parts: list[bytes] = []
        for i in range(block):
            word = successors[word, choices[i]]
            parts.append(lexicon[word])
            parts.append(b".\n" if punct[i] < 0.02 else (b". " if punct[i] < 0.1 else b" "))
        chunk = b"".join(parts)[: min(chunk_bytes, n_bytes - written)]
        written += len(chunk)
        yield chunk


def text_files(path: Path) -> list[Path]:
    """A file, or every regular non-hidden file below a folder, in sorted order."""
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(
            p for p in path.rglob("*")
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        )
        if not files:
            raise DataError(f"corpus folder {path} contains no files")
        return files
    if path.exists():
        from scalelab.planning.validation import file_kind

        raise DataError(f"corpus path {path} is {file_kind(path)}, a special file: not a regular file or folder")
    raise DataError(f"corpus path {path} does not exist")


def source_files(cfg: DatasetConfig) -> list[Path]:
    """Every file the data step reads for this source, in the order it reads them: none for
    synthetic; a text file, or every non-hidden file below a folder (sorted); a tokenized
    .bin, or a folder's train.bin and val.bin. The workflow's inputs of prepare_data, so an
    edit to any of them in place re-prepares the data. Raises DataError when unreadable."""
    if cfg.source == "synthetic":
        return []
    path = Path(cfg.path)
    if cfg.source == "text":
        return text_files(path)
    if path.is_dir():
        pairs = [path / f"{split}.bin" for split in ("train", "val")]
        missing = [str(p) for p in pairs if not p.is_file()]
        if missing:
            raise DataError(f"tokenized folder {path} lacks {', '.join(missing)}")
        return pairs
    if not path.is_file():
        raise DataError(f"tokenized file {path} does not exist")
    return [path]


class SourceRecord:
    """Each source file's size, mtime and sha256, as meta.json records them (``source.files``).

    The size and mtime are taken before the file is read, so a change while it is read shows
    as a difference at the next planning; the sha256 is taken from the very bytes the data
    step reads (:meth:`read`, :meth:`update`), so no file is read twice."""

    def __init__(self, files: Iterable[Path]):
        self.stats = {Path(f): _stat_record(Path(f)) for f in files}
        self._sha256 = {f: hashlib.sha256() for f in self.stats}

    def update(self, path: Path, data) -> None:
        self._sha256[Path(path)].update(data)

    def read(self, chunks: Iterable[tuple[Path, int, bytes]]) -> Iterator[tuple[Path, int, bytes]]:
        """(file, offset, bytes) chunks passed through, each file's bytes hashed on the way."""
        for path, offset, data in chunks:
            self.update(path, data)
            yield path, offset, data

    def files(self) -> dict:
        """{path as the config names it: {size, mtime_ns, sha256}}."""
        return {str(f): {**st, "sha256": self._sha256[f].hexdigest()} for f, st in self.stats.items()}


def file_byte_chunks(files: Iterable[Path], chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[Path, int, bytes]]:
    """(file, offset, bytes) chunks over files, reading at most chunk_bytes at a time."""
    for path in files:
        with open(path, "rb") as handle:
            offset = 0
            while chunk := handle.read(chunk_bytes):
                yield path, offset, chunk
                offset += len(chunk)


# ----------------------------------------------------------------------------- decoding


def decode_chunks(
    chunks: Iterable[tuple[Path, int, bytes]], errors: str
) -> Iterator[str]:
    """UTF-8 decode (file, offset, bytes) chunks incrementally (a character may straddle
    two chunks). With errors='strict' an undecodable byte stops with file and offset."""
    decoder, current = None, None
    for path, offset, data in chunks:
        if path != current:
            if decoder is not None:
                yield from _final(decoder, current)
            decoder, current = codecs.getincrementaldecoder("utf-8")(errors=errors), path
        try:
            text = decoder.decode(data)
        except UnicodeDecodeError as err:
            raise DataError(
                f"{path}: byte {offset + err.start} is not valid UTF-8 ({err.reason}); "
                "fix the file or set dataset.decode_errors: replace"
            ) from None
        if text:
            yield text
    if decoder is not None:
        yield from _final(decoder, current)


def _final(decoder, path) -> Iterator[str]:
    try:
        tail = decoder.decode(b"", final=True)
    except UnicodeDecodeError as err:
        raise DataError(f"{path}: the file ends inside a UTF-8 character ({err.reason})") from None
    if tail:
        yield tail


# ----------------------------------------------------------------------------- writer


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits, else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


class MemmapTokenWriter:
    """Appends token chunks to a .bin through np.memmap windows, hashing as it goes.

    The file grows by one chunk at a time (truncate, then map just the new window), so
    memory stays bounded by the chunk size. Written to a temporary file and renamed by
    :meth:`commit`, so a killed writer leaves no partial .bin behind.
    """

    def __init__(self, path: Path, dtype: np.dtype):
        self.path, self.dtype = Path(path), np.dtype(dtype)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        from scalelab.io import remove_stale_temporaries

        remove_stale_temporaries(self.path.parent, self.path.name)  # left by a killed writer
        self.tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        self.tmp.write_bytes(b"")
        self.n_tokens = 0
        self.sha256 = hashlib.sha256()

    def append(self, tokens: np.ndarray) -> None:
        if tokens.size == 0:
            return
        tokens = np.ascontiguousarray(tokens, dtype=self.dtype)
        offset = self.n_tokens * self.dtype.itemsize
        with open(self.tmp, "r+b") as handle:
            handle.truncate(offset + tokens.nbytes)
        window = np.memmap(self.tmp, dtype=self.dtype, mode="r+", offset=offset, shape=tokens.shape)
        window[:] = tokens
        window.flush()
        del window
        self.sha256.update(tokens.tobytes())
        self.n_tokens += tokens.size

    def commit(self) -> dict:
        from scalelab.io import fault_point

        fault_point(f"before_replace:{self.path.name}")
        os.replace(self.tmp, self.path)
        return {"file": self.path.name, "n_tokens": self.n_tokens, "sha256": self.sha256.hexdigest()}

    def abort(self) -> None:
        self.tmp.unlink(missing_ok=True)


def write_split(token_chunks: Iterable[np.ndarray], out_dir: Path, dtype: np.dtype, val_fraction: float) -> dict:
    """Write token chunks to train.bin/val.bin, the last val_fraction of each chunk to val."""
    writers = {split: MemmapTokenWriter(out_dir / f"{split}.bin", dtype) for split in ("train", "val")}
    try:
        max_id = -1
        for tokens in token_chunks:
            if tokens.size == 0:
                continue
            max_id = max(max_id, int(tokens.max()))
            n_val = int(round(tokens.size * val_fraction))
            writers["train"].append(tokens[: tokens.size - n_val])
            writers["val"].append(tokens[tokens.size - n_val:])
        files = {split: w.commit() for split, w in writers.items()}
    except BaseException:
        for w in writers.values():
            w.abort()
        raise
    files["max_token_id"] = max_id
    return files


# ----------------------------------------------------------------------------- prepare


def _text_byte_chunks(cfg: DatasetConfig, sources: SourceRecord, chunk_bytes: int, source_desc: dict):
    """The text source's bytes, as a function of ``record`` that yields (file, offset, chunk): the
    synthetic text, or the corpus files (an empty lone file refused). What it read from is added to
    ``source_desc``."""
    if cfg.source == "synthetic":
        source_desc.update(seed=cfg.seed, synthetic_bytes=cfg.synthetic_bytes)

        def byte_chunks(record=False):
            offset = 0
            for chunk in synthetic_text_chunks(cfg.synthetic_bytes, cfg.seed, chunk_bytes):
                yield Path("<synthetic>"), offset, chunk
                offset += len(chunk)
        return byte_chunks

    corpus = Path(cfg.path)
    corpus_files = list(sources.stats)
    for f in corpus_files:
        if f.stat().st_size == 0 and len(corpus_files) == 1:
            raise DataError(f"corpus file {f} is empty")
    source_desc.update(path=str(corpus), n_files=len(corpus_files))

    def byte_chunks(record=False):
        # Hashed in one pass only (record=True): the one whose tokens are written.
        chunks = file_byte_chunks(corpus_files, chunk_bytes)
        return sources.read(chunks) if record else chunks
    return byte_chunks


def _tokenize(cfg: DatasetConfig, out_dir: Path, byte_chunks) -> tuple[dict, int, np.dtype, str]:
    """Tokenize the text (bytes, or a BPE trained on it first and saved beside the splits) and write
    the splits: (files, vocab_size, dtype, tokenizer name)."""
    if cfg.tokenizer == "byte":
        tokenizer = ByteTokenizer()
        token_chunks = (tokenizer.encode_bytes(chunk) for _, _, chunk in byte_chunks(record=True))
    else:
        tokenizer = BPETokenizer.train(decode_chunks(byte_chunks(), cfg.decode_errors), cfg.bpe_vocab_size)
        tokenizer.save(out_dir / "tokenizer.json")
        token_chunks = (tokenizer.encode(text) for text in decode_chunks(byte_chunks(record=True), cfg.decode_errors))
    dtype = token_dtype(tokenizer.vocab_size)
    return write_split(token_chunks, out_dir, dtype, cfg.val_fraction), tokenizer.vocab_size, dtype, tokenizer.name


def _check_split_lengths(n_train: int, n_val: int, where: str, seq_len: int) -> None:
    """Refuse a corpus with no tokens, or a split shorter than one sequence."""
    if n_train + n_val == 0:
        raise DataError(f"corpus {where} is empty: no tokens")
    for split, n in (("train", n_train), ("val", n_val)):
        if n < seq_len + 1:
            raise DataError(
                f"corpus {where} gives only {n} {split} tokens, shorter than one sequence "
                f"(model.seq_len + 1 = {seq_len + 1}); use a larger corpus or a shorter seq_len"
            )


def prepare_dataset(cfg: DatasetConfig, out_dir: str | Path, seq_len: int, chunk_bytes: int = CHUNK_BYTES) -> dict:
    """Prepare ``out_dir/{train,val}.bin`` and ``meta.json`` from the configured source."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    source_desc: dict = {"source": cfg.source}

    # What the data is prepared from, file by file: a later planning compares it (changed_sources).
    sources = SourceRecord(source_files(cfg))
    if cfg.source == "tokenized":
        files, vocab_size, dtype, tokenizer_name = _copy_tokenized(cfg, out_dir, chunk_bytes, sources)
        source_desc["path"] = str(cfg.path)
    else:
        byte_chunks = _text_byte_chunks(cfg, sources, chunk_bytes, source_desc)
        files, vocab_size, dtype, tokenizer_name = _tokenize(cfg, out_dir, byte_chunks)

    n_train, n_val = files["train"]["n_tokens"], files["val"]["n_tokens"]
    _check_split_lengths(n_train, n_val, source_desc.get("path", "<synthetic>"), seq_len)
    meta = {
        "dataset": cfg.name,
        "dtype": dtype.name,
        "vocab_size": int(vocab_size),
        "tokenizer": tokenizer_name,
        "n_train_tokens": n_train,
        "n_val_tokens": n_val,
        "val_fraction": cfg.val_fraction,
        "sha256": {"train.bin": files["train"]["sha256"], "val.bin": files["val"]["sha256"]},
        # What a run compares before it reads a .bin (verify_tokens): cheap, sha256 only on a difference.
        "files": {name: _stat_record(out_dir / name) for name in ("train.bin", "val.bin")},
        "max_token_id": files["max_token_id"],
        "source": source_desc,
        "scalelab_version": __version__,
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if sources.stats:
        meta["source"]["files"] = sources.files()
    write_json(out_dir / "meta.json", meta)
    return meta


INFERRED_VOCAB_LIMIT = 1 << 16
"""Above this, a vocabulary is not inferred (largest id + 1) from a uint32 file: dataset.vocab_size
must say it. A uint16 file read as uint32 pairs two tokens into one id (a + 65536 * b), so its
largest id is at least 65,536 as soon as one odd-position token is not 0."""


def check_vocab(largest: dict, dtype: np.dtype, vocab_size: int | None) -> int:
    """The vocabulary of a tokenized source from its files' largest ids ({file: id}): the stated
    dataset.vocab_size, which every id must be below, or else the largest id + 1, refused for a
    uint32 file when above INFERRED_VOCAB_LIMIT (almost surely the wrong dtype). DataError
    naming the file and the dtype."""
    path, max_id = max(largest.items(), key=lambda item: item[1])
    if vocab_size is not None:
        if max_id >= vocab_size:
            raise DataError(
                f"tokenized file {path} read as {dtype.name} (dataset.tokenized_dtype) holds token id {max_id} "
                f">= dataset.vocab_size={vocab_size}: a wrong dataset.tokenized_dtype, or a wrong dataset.vocab_size")
        return vocab_size
    if dtype.itemsize > 2 and max_id >= INFERRED_VOCAB_LIMIT:
        raise DataError(
            f"tokenized file {path} read as {dtype.name} (dataset.tokenized_dtype) holds token id {max_id}, "
            f"an inferred vocabulary of {max_id + 1:,}: above {INFERRED_VOCAB_LIMIT:,} the vocabulary of a "
            f"{dtype.name} file is not inferred, since a uint16 file read as {dtype.name} looks like this; "
            "set dataset.tokenized_dtype: uint16, or state dataset.vocab_size if the vocabulary really is that large")
    return max_id + 1


def _copy_tokenized(cfg: DatasetConfig, out_dir: Path, chunk_bytes: int, sources: SourceRecord):
    """A nanoGPT-style .bin (or a folder with train.bin/val.bin), used as it is; each file's
    bytes are hashed into ``sources`` as they are copied."""
    src = Path(cfg.path)
    dtype = np.dtype(cfg.tokenized_dtype)
    found = list(sources.stats)
    pairs = dict(zip(("train", "val"), found)) if src.is_dir() else {"all": found[0]}
    arrays = {}
    for split, path in pairs.items():
        size = path.stat().st_size
        if size == 0:
            raise DataError(f"tokenized file {path} is empty")
        if size % dtype.itemsize:
            raise DataError(
                f"tokenized file {path} has {size} bytes, not a multiple of {dtype.itemsize} "
                f"(dataset.tokenized_dtype={dtype.name}); wrong dtype or a truncated file"
            )
        arrays[split] = np.memmap(path, dtype=dtype, mode="r")
    step = max(1, chunk_bytes // dtype.itemsize)

    def chunks(split):
        arr = arrays[split]
        for start in range(0, arr.size, step):
            chunk = np.asarray(arr[start:start + step])
            sources.update(pairs[split], chunk)
            yield chunk

    largest = {}  # file -> its largest token id
    if "all" in arrays:
        files = write_split(chunks("all"), out_dir, dtype, cfg.val_fraction)
        largest[src] = files["max_token_id"]
    else:  # train/val given: copy each as it is
        files = {}
        for split in arrays:
            writer = MemmapTokenWriter(out_dir / f"{split}.bin", dtype)
            largest[pairs[split]] = -1
            try:
                for c in chunks(split):
                    largest[pairs[split]] = max(largest[pairs[split]], int(c.max()))
                    writer.append(c)
                files[split] = writer.commit()
            except BaseException:
                writer.abort()
                raise
        files["max_token_id"] = max(largest.values())
    try:
        vocab_size = check_vocab(largest, dtype, cfg.vocab_size)
    except DataError:
        for split in ("train", "val"):
            (out_dir / f"{split}.bin").unlink(missing_ok=True)
        raise
    return files, vocab_size, dtype, "pretokenized"


def read_meta(data_dir: str | Path) -> dict:
    return json.loads((Path(data_dir) / "meta.json").read_text())


def _stat_record(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def file_sha256(path: str | Path, chunk_bytes: int = CHUNK_BYTES) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


def verify_tokens(data_dir: str | Path, meta: dict, name: str = "train.bin") -> str | None:
    """None when ``data_dir/name`` is the file meta.json describes, else what differs.

    Cheap in the common case: size and mtime as recorded when the data was prepared. The
    sha256 is computed only when they differ (a copy, a touch) or were not recorded (a
    meta.json of an earlier version): same bytes then still pass, other bytes never do."""
    path = Path(data_dir) / name
    fix = ("; the tokens were changed after the data was prepared: re-prepare them "
           "(snakemake --forcerun prepare_data) rather than train on other tokens")
    if not path.is_file():
        return f"{path} is missing (meta.json describes it){fix}"
    st = path.stat()
    recorded = (meta.get("files") or {}).get(name)
    if recorded and (st.st_size, st.st_mtime_ns) == (recorded["size"], recorded["mtime_ns"]):
        return None
    n_tokens = meta.get(f"n_{name.split('.')[0]}_tokens")
    size = recorded["size"] if recorded else (n_tokens * np.dtype(meta["dtype"]).itemsize if n_tokens is not None else None)
    if size is not None and st.st_size != size:
        return f"{path} has {st.st_size} bytes, meta.json records {size}{fix}"
    expected = meta["sha256"][name]
    actual = file_sha256(path)
    if actual != expected:
        changed = datetime.datetime.fromtimestamp(st.st_mtime, datetime.timezone.utc).isoformat(timespec="seconds")
        return f"{path} has sha256 {actual[:16]}..., meta.json records {expected[:16]}... (file modified {changed}){fix}"
    return None


def changed_sources(files: Iterable[Path], data_dir: str | Path) -> list[str]:
    """What differs between these source files and the ones the data in ``data_dir`` was
    prepared from (meta.json's ``source.files``), one line per file; [] when nothing does, or
    nothing was recorded (no meta.json yet, a synthetic source, a meta.json of an earlier version).

    Compared when the workflow is planned, whatever the files' times say: a copy of another
    version carrying an older mtime (``rsync -a``, ``cp -p``) is a change, which Snakemake's
    time comparison alone misses. Cheap in the common case: size and mtime as recorded; a file
    is hashed only when its mtime differs, so a touch or a copy of the same bytes still matches."""
    try:
        recorded = read_meta(data_dir)["source"]["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    current = {str(f): Path(f) for f in files}
    changes = [f"{name}: read when the data was prepared, now gone" for name in recorded if name not in current]
    for name, path in current.items():
        was = recorded.get(name)
        if was is None:
            changes.append(f"{name}: a new file, not read when the data was prepared")
            continue
        now = _stat_record(path)
        if now == {"size": was["size"], "mtime_ns": was["mtime_ns"]}:
            continue
        if now["size"] != was["size"]:
            changes.append(f"{name}: {now['size']} bytes, the data was prepared from {was['size']}")
        elif (sha := file_sha256(path)) != was["sha256"]:
            changes.append(f"{name}: sha256 {sha[:16]}..., the data was prepared from {was['sha256'][:16]}...")
    return changes


STALE_MTIME_NS = 1_000_000_000
"""The time mark_stale gives meta.json: one second after the epoch (Snakemake ignores an
output time of 0), older than any source file written since."""


def mark_stale(data_dir: str | Path) -> None:
    """Date ``data_dir/meta.json`` back to 1970, so that the sources are newer than the
    prepared data: Snakemake's own rule then re-prepares it (an input newer than an output, and
    where Snakemake keeps an input's checksum, a checksum that differs) and reruns what depends
    on it. Nothing else reads meta.json's time; the next preparation writes a new one."""
    path = Path(data_dir) / "meta.json"
    os.utime(path, ns=(path.stat().st_atime_ns, STALE_MTIME_NS))


# ----------------------------------------------------------------------------- sampler


@dataclass
class BatchSampler:
    """Random windows of seq_len+1 tokens over a token memmap.

    The global batch of step ``s`` is a function of (seed, step) alone; rank ``r`` takes
    rows ``[r*B, (r+1)*B)`` of it. So batches are deterministic given (seed, step, rank),
    disjoint across ranks within a step (windows are drawn without replacement), and a
    single process fed the whole global batch sees exactly what the ranks see together:
    the basis of the parity tests.
    """

    path: str | Path
    dtype: str
    seq_len: int
    seed: int

    def __post_init__(self):
        self.tokens = np.memmap(self.path, dtype=np.dtype(self.dtype), mode="r")
        self.n_windows = self.tokens.size - self.seq_len  # valid starts of seq_len+1 windows
        if self.n_windows < 1:
            raise DataError(f"{self.path}: {self.tokens.size} tokens, fewer than seq_len + 1 = {self.seq_len + 1}")
        # A zero-copy (n_windows, seq_len+1) view: indexing it with starts gathers whole
        # windows at once, with no Python loop per sequence.
        self._windows = np.lib.stride_tricks.sliding_window_view(self.tokens, self.seq_len + 1)

    def global_starts(self, step: int, global_batch: int) -> np.ndarray:
        rng = np.random.default_rng([self.seed, step])
        replace = global_batch > self.n_windows  # tiny corpora: repeats are unavoidable
        return rng.choice(self.n_windows, size=global_batch, replace=replace)

    def batch(self, step: int, rank: int, batch_size: int, world_size: int = 1) -> np.ndarray:
        """(batch_size, seq_len+1) int64 tokens for this rank at this step."""
        starts = self.global_starts(step, batch_size * world_size)[rank * batch_size:(rank + 1) * batch_size]
        return self._windows[starts].astype(np.int64)
