#!/usr/bin/env bash
# Regenerates the results trees in this folder with the real code of earlier commits, one per
# run-folder layout this project has written (3, 7, 9 and 10 folder levels per run), for the
# migration tests (tests/*/test_migrate.py). Run from the repository root with the project's venv:
#   bash tests/data/old_layouts/make.sh
# Each tree: a tiny sweep (the sweep-N.yaml beside it) run by `snakemake` in a worktree of that
# commit; kept: runs/, logs/runs/, the collected tables and, for the newest, the prepared data and
# Snakemake's metadata (snakemake-metadata/, the recorded params: an upgrade must not see them as
# changed). The newest's sweep-10.yaml is its whole config.yaml, a partial dataset section as users
# write one (the schema adds the rest after it). Machine paths in the logs become <checkout>, <venv>.
set -euo pipefail
here=tests/data/old_layouts
venv=$(cd .venv && pwd)
for entry in "ec9daac 3" "2aeb5bd 7" "4ac0796 9" "6701248 10"; do
  set -- $entry; commit=$1; depth=$2; name="$commit-$depth-levels"
  wt=$(mktemp -d)/wt
  git worktree add -f --detach "$wt" "$commit" >/dev/null
  if [ "$depth" = 10 ]; then cp "$here/sweep-$depth.yaml" "$wt/config.yaml"; extra=(); else
    cp "$here/sweep-$depth.yaml" "$wt/sweep.yaml"; extra=(--configfile sweep.yaml); fi
  (cd "$wt" && PYTHONPATH="$wt/src" timeout 900 "$venv/bin/snakemake" --cores 2 "${extra[@]}" >/dev/null 2>&1)
  rm -rf "$here/$name" && mkdir -p "$here/$name/logs"
  cp -a "$wt/results/runs" "$wt/results/metrics.parquet" "$wt/results/steps.parquet" "$here/$name/"
  cp -a "$wt/results/logs/runs" "$here/$name/logs/"
  [ "$depth" = 10 ] && cp -a "$wt/results/data" "$here/$name/" && cp -a "$wt/.snakemake/metadata" "$here/$name/snakemake-metadata"
  find "$here/$name" \( -name '*.log' -o -name '*.json' \) -exec sed -i -e "s|$wt|<checkout>|g" -e "s|$venv|<venv>|g" {} +
  git worktree remove --force "$wt"
done
