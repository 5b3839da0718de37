"""What tests/*/test_data.py share: the helpers tests of more than one tier use."""
import os


def _rewrite_in_place(path, transform):
    """What a nanoGPT prepare script does to an existing .bin: same file, new bytes, new mtime."""
    st = path.stat()
    data = path.read_bytes()
    with open(path, "r+b") as handle:
        handle.write(transform(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
