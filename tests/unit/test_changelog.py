"""CHANGELOG.md is dated releases in Keep a Changelog's form: Unreleased first, then releases newest first, each
with known sections; the package's version is past the newest release."""
import re

from scalelab import __version__
from support import REPO


def test_the_changelog_is_dated_releases_newest_first():
    text = (REPO / "CHANGELOG.md").read_text()
    heads = re.findall(r"^## \[([^\]]+)\](?: - (\d{4}-\d{2}-\d{2}))?$", text, flags=re.M)
    assert heads[0] == ("Unreleased", "") and len(heads) >= 2, heads
    releases = heads[1:]
    assert all(date for _, date in releases), releases
    versions = [tuple(int(x) for x in v.split(".")) for v, _ in releases]
    assert versions == sorted(versions, reverse=True) and [d for _, d in releases] == sorted((d for _, d in releases), reverse=True)
    assert set(re.findall(r"^### (\w+)$", text, flags=re.M)) <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}
    newest = versions[0]
    assert tuple(int(x) for x in re.match(r"(\d+)\.(\d+)\.(\d+)", __version__).groups()) > newest, __version__
