#!/usr/bin/env bash
# Regenerates the results tree in this folder with the real code of an earlier commit in today's layout
# (runs/<run id>/), for the test that an upgrade keeps cached results valid (tests/workflow/test_cached_tree.py):
# a tiny sweep (sweep-<commit>.yaml, the whole config.yaml of that checkout) run by `snakemake` in a worktree of
# that commit. Kept: runs/, logs/runs/, the prepared data, the calibrations, the collected tables and Snakemake's metadata
# (snakemake-metadata/: the params it recorded, which an upgrade must not read as changed). Machine paths in
# the logs and JSON become <checkout>, <venv>. Run from the repository root with the project's venv:
#   bash tests/data/cached_trees/make.sh
set -euo pipefail
here=tests/data/cached_trees
venv=$(cd .venv && pwd)
for commit in f6ec2f4; do
  wt=$(mktemp -d)/wt
  git worktree add -f --detach "$wt" "$commit" >/dev/null
  cp "$here/sweep-$commit.yaml" "$wt/config.yaml"
  (cd "$wt" && PYTHONPATH="$wt/src" timeout 900 "$venv/bin/snakemake" --cores 2 >/dev/null 2>&1)
  rm -rf "${here:?}/$commit" && mkdir -p "$here/$commit/logs"
  cp -a "$wt/results/runs" "$wt/results/data" "$wt/results/calibration" "$wt/results/metrics.parquet" "$wt/results/steps.parquet" "$here/$commit/"
  cp -a "$wt/results/logs/runs" "$here/$commit/logs/"
  cp -a "$wt/.snakemake/metadata" "$here/$commit/snakemake-metadata"
  find "$here/$commit" \( -name '*.log' -o -name '*.json' -o -name '*.jsonl' \) -exec sed -i -e "s|$wt|<checkout>|g" -e "s|$venv|<venv>|g" {} +
  git worktree remove --force "$wt"
done
